"""Finding a running plugin's sockets the way kubelet does, for `dra-driver kubelet-client`.

Agent pods put their pod UID in their socket names (`<driver>-<uid>-reg.sock`, `dra-<uid>.sock`),
so an operator cannot know the names in advance. Kubelet calls the newest plugin that is
connected; this picks the same one: the newest socket, by modification time, that accepts a
connection. Sockets of agents that died without cleaning up are skipped, and named in the error
when no socket is live.
"""

import re
import stat
from pathlib import Path

import msgspec

from dra_driver.base.errors import TransientFault
from dra_driver.plugin.sockets import DRA_SOCKETS_PATTERN, connect_problem, registration_sockets_pattern


class NoLiveSocketError(TransientFault, RuntimeError):
    """No socket of the driver accepts connections; the message lists what was found."""


class Candidate(msgspec.Struct, frozen=True):
    path: Path
    mtime: float
    # Why it is not used; empty for a live socket.
    problem: str


def candidates(directory: Path, name_pattern: str) -> list[Candidate]:
    """Files in `directory` whose names match, newest first, each with why it is not usable."""
    pattern = re.compile(name_pattern)
    try:
        entries = [path for path in directory.iterdir() if pattern.fullmatch(path.name)]
    except OSError:
        return []
    found = []
    for path in entries:
        try:
            status = path.lstat()
        except FileNotFoundError:
            continue
        problem = "not a socket" if not stat.S_ISSOCK(status.st_mode) else connect_problem(path)
        found.append(Candidate(path, status.st_mtime, problem))
    return sorted(found, key=lambda candidate: candidate.mtime, reverse=True)


def _live(directory: Path, name_pattern: str, what: str, expected_names: str) -> Path:
    found = candidates(directory, name_pattern)
    for candidate in found:
        if not candidate.problem:
            return candidate.path
    if not found:
        raise NoLiveSocketError(
            f"no {what} in {directory} (looked for {expected_names}); is the agent running?"
        )
    listed = ", ".join(f"{candidate.path.name} ({candidate.problem})" for candidate in found)
    raise NoLiveSocketError(f"no live {what} in {directory}; found {listed}")


def live_registration_socket(registrar_dir: Path, driver_name: str) -> Path:
    return _live(
        registrar_dir,
        registration_sockets_pattern(driver_name),
        f"registration socket of {driver_name}",
        f"{driver_name}-reg.sock or {driver_name}-<pod uid>-reg.sock",
    )


def live_dra_socket(plugins_dir: Path, driver_name: str) -> Path:
    return _live(
        plugins_dir / driver_name,
        DRA_SOCKETS_PATTERN,
        f"DRA socket of {driver_name}",
        "dra.sock or dra-<pod uid>.sock",
    )
