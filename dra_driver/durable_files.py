"""Atomic file replacement, with and without durability.

A reader (kubelet's runtime, a restarted agent) must only ever see a whole old file or a whole
new one: data goes to a temporary sibling that is renamed over the target. Durable writes also
fsync the file before the rename and the directory after it, so the rename itself survives a
power loss.
"""

import os
import secrets
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temporary(path: Path, data: bytes, mode: int) -> tuple[Path, int]:
    """Writes data to a new temporary sibling of path (named so a start-up sweep of `.*.tmp`
    finds leftovers); returns it and its still-open descriptor."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        temporary.unlink(missing_ok=True)
        raise
    return temporary, fd


def atomic_write(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    temporary, fd = write_temporary(path, data, mode)
    try:
        try:
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)


def remove(path: Path, *, durable: bool) -> bool:
    """Removes `path` if it exists; returns whether it did. Durable removal fsyncs the directory."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if durable:
        fsync_directory(path.parent)
    return True
