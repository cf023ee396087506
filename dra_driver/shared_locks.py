"""Locks shared by every agent process on the node, for rolling updates.

During a rolling update the old and the new agent pod run side by side on one state directory,
and kubelet may send a claim's prepare to one and its unprepare to the other. Three locks keep
them correct together without serialising unrelated claims:

- `ClaimLocks`: one lock per claim UID, so two processes never work on the same claim at once
  (a byte-range lock of one shared file, also dying with its process);
- `SharedStateLock`: a short node-wide turn for reading and changing who holds which device,
  with a change counter that tells a process when a peer changed the records since its last turn;
- `try_exclusive`: the one-owner lock that decides which agent publishes the ResourceSlices.

All of them die with their process, so a crashed peer never leaves one held. Waiting polls with
non-blocking attempts instead of blocking a thread: a thread blocked on a lock cannot be
cancelled and would take the lock after its caller gave up, holding it for good.
"""

import asyncio
import fcntl
import hashlib
import os
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from dra_driver.claims.keyed_locks import KeyedLocks

_FIRST_POLL_SECONDS = 0.001
_LONGEST_POLL_SECONDS = 0.02
_COUNTER_BYTES = 8


def open_lock_file(path: Path) -> int:
    """A descriptor to lock, its directory made if missing: the file is only ever a lock (and a
    counter), never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def try_exclusive(fd: int) -> bool:
    """Takes the lock on `fd` if nobody else holds it; never waits."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


async def exclusive(fd: int, longest_poll: float = _LONGEST_POLL_SECONDS) -> None:
    """Takes the lock on `fd`, waiting as long as it takes; `longest_poll` bounds how late a
    waiter notices that the holder let go."""
    await _wait_for(lambda: try_exclusive(fd), longest_poll)


async def _wait_for(take: Callable[[], bool], longest_poll: float = _LONGEST_POLL_SECONDS) -> None:
    delay = min(_FIRST_POLL_SECONDS, longest_poll)
    while not take():
        await asyncio.sleep(delay)
        delay = min(delay * 2, longest_poll)


@dataclass(slots=True)
class StateTurn:
    """One holder's turn: `stale` says a peer changed the records since this process last looked;
    `changed()` tells peers that this turn did."""

    stale: bool
    _changed: bool = False

    def changed(self) -> None:
        self._changed = True


class SharedStateLock:
    """The node-wide turn, held only for in-memory checks and small non-durable writes.

    The change counter lives in the lock file itself and is only read and written under the
    lock; it needs no fsync, because after a reboot every process starts from the records anyway.
    """

    def __init__(self, path: Path) -> None:
        self._fd = open_lock_file(path)
        # flock does not exclude two coroutines of one process (they share the descriptor).
        self._turns = asyncio.Lock()
        self._seen: int | None = None

    def _counter(self) -> int:
        return int.from_bytes(os.pread(self._fd, _COUNTER_BYTES, 0).ljust(_COUNTER_BYTES, b"\0"), "little")

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[StateTurn]:
        async with self._turns:
            await exclusive(self._fd)
            try:
                counter = self._counter()
                turn = StateTurn(stale=counter != self._seen)
                self._seen = None  # unless the turn ends well: a half-refreshed view is looked at again
                try:
                    yield turn
                finally:
                    if turn._changed:
                        counter += 1
                        os.pwrite(self._fd, counter.to_bytes(_COUNTER_BYTES, "little"), 0)
                self._seen = counter
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class ClaimLocks:
    """One lock per claim UID, across this process's coroutines and every agent process.

    All claims share one lock file: each claim locks one byte of it, at an offset hashed from its
    UID, with an open-file-description lock (fcntl F_OFD_SETLK). Like flock, such a lock belongs to
    this descriptor and dies with the process; unlike a lock file per claim it costs no file
    creation and removal on the state directory's disk, two system calls instead of five. Two
    UIDs that hash to the same byte (48 bits: about one pair in 10^14) only wait on each other.
    """

    def __init__(self, path: Path) -> None:
        self._fd = open_lock_file(path)
        # Locks of one open file description never exclude each other: coroutines queue here.
        self._local = KeyedLocks()

    @asynccontextmanager
    async def hold(self, claim_uid: str) -> AsyncIterator[None]:
        offset = _offset_of(claim_uid)
        async with self._local.hold(offset):
            await _wait_for(lambda: _try_lock_byte(self._fd, offset))
            try:
                yield
            finally:
                _unlock_byte(self._fd, offset)

    def close(self) -> None:
        os.close(self._fd)

    def __len__(self) -> int:
        return len(self._local)


# struct flock as Linux lays it out on 64-bit machines: l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = struct.Struct("hhqqi4x")


def _offset_of(claim_uid: str) -> int:
    return int.from_bytes(hashlib.blake2b(claim_uid.encode(), digest_size=6).digest(), "little")


def _try_lock_byte(fd: int, offset: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another holder
        return False
    return True


def _unlock_byte(fd: int, offset: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, offset, 1, 0))
