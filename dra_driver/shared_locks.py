"""Locks shared by every agent process on the node, for rolling updates.

During a rolling update the old and the new agent pod run side by side on one state directory,
and kubelet may send a claim's prepare to one and its unprepare to the other. Three flock(2)
locks keep them correct together without serialising unrelated claims:

- `ClaimLocks`: one lock per claim UID, so two processes never work on the same claim at once;
- `SharedStateLock`: a short node-wide turn for reading and changing who holds which device,
  with a change counter that tells a process when a peer changed the records since its last turn;
- `try_exclusive`: the one-owner lock that decides which agent publishes the ResourceSlices.

flock locks die with their process, so a crashed peer never leaves one held. Waiting polls with
LOCK_NB instead of blocking a thread: a thread blocked in flock cannot be cancelled and would take
the lock after its caller gave up, holding it for good.
"""

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from dra_driver.claims.keyed_locks import KeyedLocks

_FIRST_POLL_SECONDS = 0.001
_LONGEST_POLL_SECONDS = 0.02
_COUNTER_BYTES = 8


def open_lock_file(path: Path) -> int:
    """A descriptor to flock: the file is only ever a lock (and a counter), never replaced."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def try_exclusive(fd: int) -> bool:
    """Takes the lock on `fd` if nobody else holds it; never waits."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _still_named(fd: int) -> bool:
    """Whether the locked file is still the claim's lock file: a holder unlinks it (its only name)
    before letting go, so a file with no name left was given up while we waited for it."""
    return os.fstat(fd).st_nlink > 0


async def exclusive(fd: int, longest_poll: float = _LONGEST_POLL_SECONDS) -> None:
    """Takes the lock on `fd`, waiting as long as it takes; `longest_poll` bounds how late a
    waiter notices that the holder let go."""
    delay = min(_FIRST_POLL_SECONDS, longest_poll)
    while not try_exclusive(fd):
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
        path.parent.mkdir(parents=True, exist_ok=True)
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

    A lock file exists only while someone holds it: the holder unlinks it before letting go, so
    files do not pile up per claim ever seen. A waiter that then wins the lock on the unlinked
    file notices (its inode is no longer the path's) and tries again on a fresh one.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._local = KeyedLocks()

    @asynccontextmanager
    async def hold(self, claim_uid: str) -> AsyncIterator[None]:
        """`claim_uid` must have been checked: it names a file."""
        async with self._local.hold(claim_uid):
            path = self._directory / claim_uid
            fd = await self._lock(path)
            try:
                yield
            finally:
                with suppress(FileNotFoundError):
                    path.unlink()
                os.close(fd)

    @staticmethod
    async def _lock(path: Path) -> int:
        while True:
            fd = open_lock_file(path)
            try:
                await exclusive(fd)
            except BaseException:
                os.close(fd)
                raise
            if _still_named(fd):
                return fd
            os.close(fd)  # the holder we waited for removed this file: lock a fresh one

    def __len__(self) -> int:
        return len(self._local)
