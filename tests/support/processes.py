"""Whether a process the tests started is still running, read from /proc without races."""

from pathlib import Path


def process_state(pid: int) -> str | None:
    """The state letter of a live process; None once it is gone (a zombie is gone too). A process
    can end between opening its stat file and reading it (ESRCH): gone as well."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if state in ("Z", "X") else state


def process_alive(pid: int) -> bool:
    return process_state(pid) is not None
