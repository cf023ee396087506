"""One asyncio lock per key, created on demand and dropped when nobody holds or awaits it.

Calls for the same claim (a shared claim used by two pods, or kubelet retrying) must not
interleave, while calls for different claims must not wait on each other.
"""

import asyncio
from collections.abc import Hashable
from types import TracebackType


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def hold(self, key: Hashable) -> "KeyHold":
        return KeyHold(self._locks, key)

    def __len__(self) -> int:
        return len(self._locks)


class KeyHold:
    """`async with` the key's lock. A class rather than an async generator: it is taken twice
    per prepare and unprepare, where a generator-based context manager cost several times the
    lock itself (issue 31)."""

    __slots__ = ("_key", "_lock", "_locks")

    def __init__(self, locks: dict[Hashable, tuple[asyncio.Lock, int]], key: Hashable) -> None:
        self._locks = locks
        self._key = key
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._key) or (asyncio.Lock(), 0)
        self._locks[self._key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting: no longer a user
            self._leave()
            raise
        self._lock = lock

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._lock is not None
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        lock, users = self._locks[self._key]
        if users == 1:
            del self._locks[self._key]
        else:
            self._locks[self._key] = (lock, users - 1)
