"""The stand-in API server as a process of its own, the way every benchmark runs it: neither the
agent nor the benchmark then carries its memory or CPU."""

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def standin_apiserver(kubeconfig: Path) -> Iterator[str]:
    """Yields the stand-in's URL once it listens and has written `kubeconfig`; stops it after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.apiserver", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()  # printed once it listens; "" if it died
        if not url.startswith("http://"):
            raise RuntimeError(f"the stand-in API server did not start (exit {process.poll()})")
        yield url
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
