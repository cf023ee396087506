"""The stand-in API server as a process of its own, the way every benchmark runs it: neither the
agent nor the benchmark then carries its memory or CPU."""

import contextlib
import subprocess
import sys
import tempfile
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


@contextlib.contextmanager
def bench_workspace() -> Iterator[tuple[Path, Path]]:
    """A temporary work directory with the stand-in running: yields the directory and the
    kubeconfig that reaches the stand-in; both go on leaving."""
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as temporary:
        work = Path(temporary)
        kubeconfig = work / "kubeconfig"
        with standin_apiserver(kubeconfig):
            yield work, kubeconfig
