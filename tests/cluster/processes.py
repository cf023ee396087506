"""The cluster's processes: started detached (a session of their own, so they outlive `make
cluster`), logged to the cluster's log directory, remembered by pid file, waited for by their
health endpoints, and stopped by name.
"""

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.cluster.layout import Layout

_POLL = 0.25


class ProcessError(Exception):
    pass


def _pid_file(layout: Layout, name: str) -> Path:
    return layout.pids / f"{name}.pid"


def log_file(layout: Layout, name: str) -> Path:
    return layout.logs / f"{name}.log"


def start(layout: Layout, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> int:
    """Starts `argv` as service `name` in a new session; its output is appended to the log."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    log = log_file(layout, name)
    with log.open("ab") as output:
        output.write(f"\n==== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        output.flush()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    _pid_file(layout, name).write_text(f"{process.pid}\n")
    _command_file(layout, name).write_text(
        json.dumps({"argv": argv, "env": dict(env) if env is not None else None})
    )
    return process.pid


def _command_file(layout: Layout, name: str) -> Path:
    return layout.pids / f"{name}.command.json"


def restart(layout: Layout, name: str) -> int:
    """Stops the service and starts it again with the command it was started with (the fault
    tests restart kubelet, containerd and the API server under running pods)."""
    command = json.loads(_command_file(layout, name).read_text())
    stop(layout, name)
    return start(layout, name, command["argv"], command["env"])


def pid_of(layout: Layout, name: str) -> int | None:
    """The service's pid while it runs; None when it never started or has exited."""
    try:
        pid = int(_pid_file(layout, name).read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _reap(pid: int) -> None:
    """A child of this process (a service started by the same Python) is reaped, not a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(layout: Layout, name: str, grace: float = 10.0, sig: int = signal.SIGTERM) -> bool:
    """Signals the service's process group and waits for its leader to exit (SIGKILL after
    `grace`). True when it was running."""
    pid = pid_of(layout, name)
    if pid is None:
        return False
    kill_group(pid, sig)
    deadline = time.monotonic() + grace
    while alive(pid):
        _reap(pid)
        if time.monotonic() > deadline:
            kill_group(pid, signal.SIGKILL)
        time.sleep(0.05)
    _reap(pid)
    _pid_file(layout, name).unlink(missing_ok=True)
    return True


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def wait_until(what: str, check: Callable[[], bool], timeout: float, layout: Layout, name: str) -> None:
    """Polls `check` until true; fails with the service's log tail when it exits or times out."""
    deadline = time.monotonic() + timeout
    while not check():
        if pid_of(layout, name) is None:
            raise ProcessError(f"{name} exited before {what}; its log's end:\n{log_tail(layout, name)}")
        if time.monotonic() > deadline:
            raise ProcessError(
                f"{name}: not {what} after {timeout:.0f}s; its log's end:\n{log_tail(layout, name)}"
            )
        time.sleep(_POLL)


def log_tail(layout: Layout, name: str, lines: int = 25) -> str:
    try:
        text = log_file(layout, name).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def https_ok(url: str, ca: Path, certificate: Path | None = None, key: Path | None = None) -> bool:
    """A GET answered 200, over TLS verified against the cluster's CA (with a client certificate
    where the endpoint needs one)."""
    context = ssl.create_default_context(cafile=str(ca))
    if certificate is not None:
        context.load_cert_chain(str(certificate), str(key) if key else None)
    return _get_ok(url, context)


def http_ok(url: str) -> bool:
    return _get_ok(url, None)


def _get_ok(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return False


def insecure_https_ok(url: str) -> bool:
    """A component's /healthz over its self-signed serving certificate (controller-manager,
    scheduler): their health endpoints are open to anyone by design."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return _get_ok(url, context)
