"""Unix socket files for kubelet plugins."""

import socket
import stat
from pathlib import Path

# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


class SocketPathError(ValueError):
    """A socket path that cannot be bound, or a non-socket file in the way."""


def socket_path_problem(path: Path) -> str | None:
    length = len(str(path).encode())
    if length > MAX_SOCKET_PATH_BYTES:
        return f"socket path {path} is {length} bytes; unix sockets allow at most {MAX_SOCKET_PATH_BYTES}"
    return None


def _someone_listens(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:  # refused: nobody listens any more
        return False
    finally:
        probe.close()
    return True


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
