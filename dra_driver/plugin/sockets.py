"""Unix socket files for kubelet plugins.

With rolling updates two agent pods serve one driver on a node for a while, so each pod's sockets
carry its pod UID: kubelet (>= 1.33) registers both endpoints and calls the newest connected one.
"""

import base64
import hashlib
import re
import socket
import stat
from pathlib import Path

from dra_driver.base.errors import OperatorFault
from dra_driver.kube.k8s_names import UID_PATTERN

# sockaddr_un.sun_path is 108 bytes including the terminating NUL, but gRPC's own address check
# refuses a path of more than 105 bytes (grpcio 1.85: "Path name should not have more than 107
# characters" for a 106-byte path). Found on the local cluster, whose kubelet directory is longer
# than /var/lib/kubelet: the agent crashed binding its socket instead of saying so at start.
MAX_SOCKET_PATH_BYTES = 105


class SocketPathError(OperatorFault, ValueError):
    """A socket path that cannot be bound, or a non-socket file in the way."""


def hidden_socket_path(path: Path) -> Path:
    """Where a socket is bound before it is renamed to `path`: a dot name, which kubelet's plugin
    watcher ignores."""
    return path.with_name(f".{path.name}~")


def socket_path_problem(path: Path) -> str | None:
    """The socket is bound under its hidden name first, which is two bytes longer."""
    length = len(str(path).encode())
    if length + 2 > MAX_SOCKET_PATH_BYTES:
        return (
            f"socket path {path} is {length} bytes; unix sockets allow at most "
            f"{MAX_SOCKET_PATH_BYTES}, and the agent binds it as .<name>~ first (2 bytes more)"
        )
    return None


def dra_socket_name(pod_uid: str | None) -> str:
    return f"dra-{pod_uid}.sock" if pod_uid else "dra.sock"


def _short_hash(data: bytes, length: int) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()[:length]).decode().rstrip("=")


def registration_socket_path(registrar_dir: Path, driver_name: str, pod_uid: str | None) -> Path:
    """`<driver>-reg.sock`, or with a pod UID `<driver>-<uid>-reg.sock`; when that would not fit
    in a socket address, the UID (and then the driver name too) is replaced by a short hash, as
    the upstream plugin helper does, so a long driver name never makes rolling updates fail."""
    if not pod_uid:
        return registrar_dir / f"{driver_name}-reg.sock"
    both = driver_name.encode() + b"\0" + pod_uid.encode()
    candidates = (
        f"{driver_name}-{pod_uid}-reg.sock",
        f"{driver_name}-{_short_hash(pod_uid.encode(), 8)}-reg.sock",
        f"dra-{_short_hash(both, 16)}-reg.sock",
    )
    for name in candidates:
        if socket_path_problem(registrar_dir / name) is None:
            return registrar_dir / name
    return registrar_dir / candidates[-1]  # too long whatever the name: the settings check says so


# Our DRA sockets, in a directory that is the driver's alone.
DRA_SOCKETS_PATTERN = rf"dra(-{UID_PATTERN})?\.sock"


def registration_sockets_pattern(driver_name: str) -> str:
    """Our registration sockets, with or without a pod UID (or its short hash). The last-resort
    name carries no driver name, so nothing tells it apart from another driver's: never swept."""
    return rf"{re.escape(driver_name)}(-{UID_PATTERN}|-[A-Za-z0-9_-]{{11}})?-reg\.sock"


def remove_dead_sockets(directory: Path, name_pattern: str) -> list[Path]:
    """Sockets left by agent pods that were killed without cleaning up (their names carry other
    pod UIDs, so no start ever reuses them): kubelet would keep a registration for each. A socket
    someone still serves on is a peer's, and stays."""
    removed: list[Path] = []
    pattern = re.compile(name_pattern)
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if not pattern.fullmatch(path.name):
            continue
        try:
            is_socket = stat.S_ISSOCK(path.lstat().st_mode)
        except FileNotFoundError:
            continue
        if is_socket and not _someone_listens(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def connect_problem(path: Path) -> str:
    """Empty when someone serves on the socket; else why a connection failed (refused: nobody
    listens any more)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as error:
        return error.strerror or type(error).__name__
    finally:
        probe.close()
    return ""


def _someone_listens(path: Path) -> bool:
    return not connect_problem(path)


def clear_stale_socket(path: Path) -> None:
    """Removes a socket left by an earlier run, so binding does not fail with 'address in use'.

    Anything that is not a socket is left alone (deleting an operator's file by mistake is worse
    than refusing to start), and so is a socket another live process still serves on: taking it
    over would silently cut that process off from kubelet.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    if _someone_listens(path):
        raise SocketPathError(f"{path} is in use: another process serves on it; refusing to take it over")
    path.unlink(missing_ok=True)
