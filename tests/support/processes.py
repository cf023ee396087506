"""Whether a process the tests started is still running, and which simulated MPS daemons run,
read from /proc without races."""

import os
from pathlib import Path

from dra_driver.hardware.simulated_mps_control import MODULE


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


def simulated_mps_daemons() -> set[int]:
    """The simulated MPS control daemons running on this machine now, started by any test run:
    processes whose command line ends in `-m dra_driver.hardware.simulated_mps_control -d` (the
    launcher for a moment, then the daemon) or `-f` (a daemon in the foreground)."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            arguments = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        # The command line ends in NUL, so its last argument is second to last here.
        if tuple(arguments[-4:-1]) in _DAEMON_COMMANDS:
            found.add(int(entry.name))
    return found


_DAEMON_COMMANDS = {(b"-m", MODULE.encode(), option) for option in (b"-d", b"-f")}
