"""Atomic file replacement, with and without durability.

A reader (kubelet's runtime, a restarted agent) must only ever see a whole old file or a whole
new one: data goes to a temporary sibling that is renamed over the target. Durable writes also
fsync the file before the rename and the directory after it, so the rename itself survives a
power loss.

Paths are handled as strings with `os` calls: these functions sit on the pod-startup path, where
building `pathlib` objects for every temporary name cost more than the system calls themselves.
"""

import os
import secrets

StrPath = str | os.PathLike[str]

_READ_SIZE = 64 * 1024


def parent_directory(path: StrPath) -> str:
    return os.path.dirname(os.fspath(path)) or "."


def fsync_directory(directory: StrPath) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_if_present(path: StrPath) -> bool:
    """Whether there was a file to remove."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def read_whole(path: StrPath) -> bytes:
    """The file's bytes, read with plain descriptor calls: a buffered file object costs more
    than the two system calls of a record-sized read (every prepare and unprepare reads one)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_temporary(path: StrPath, data: bytes, mode: int) -> tuple[str, int]:
    """Writes data to a new temporary sibling of path (named so a start-up sweep of `.*.tmp`
    finds leftovers); returns it and its still-open descriptor."""
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        unlink_if_present(temporary)
        raise
    return temporary, fd


def atomic_write(path: StrPath, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    temporary, fd = write_temporary(path, data, mode)
    try:
        try:
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        unlink_if_present(temporary)
        raise
    if durable:
        fsync_directory(parent_directory(path))


def create_new(path: StrPath, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    """Writes a file that must not exist yet: a reader sees no file or all of it. Raises
    FileExistsError, leaving the file that is there as it is. A link, unlike a rename, refuses
    a name that exists. Durable creation fsyncs the file before it gets its name and the
    directory after, so the name survives a power loss with the data behind it."""
    temporary, fd = write_temporary(path, data, mode)
    try:
        try:
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temporary, path)
    finally:
        unlink_if_present(temporary)  # linked or refused, the temporary name is done with
    if durable:
        fsync_directory(parent_directory(path))


def remove(path: StrPath, *, durable: bool) -> bool:
    """Removes `path` if it exists; returns whether it did. Durable removal fsyncs the directory."""
    if not unlink_if_present(path):
        return False
    if durable:
        fsync_directory(parent_directory(path))
    return True
