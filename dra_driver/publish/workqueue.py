"""A rate-limited work queue for asyncio, with client-go's semantics.

A key is queued at most once; a key re-added while it is being worked on is worked on again
afterwards (never twice at the same time); failures back off per key, exponentially, and all
retries together stay under a token bucket, so a broken API server is not hammered.
"""

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import TransientFault

Key = TypeVar("Key", bound=Hashable)

# client-go's default controller rate limiter starts at 5 ms; it caps at 1000 s, which leaves a
# node without slices for a quarter of an hour after a long API outage. 30 s is the worst wait
# here once the server answers again.
RETRY = Backoff(first=0.005, cap=30.0)
RETRIES_PER_SECOND = 10.0
RETRY_BURST = 100


class RateLimiter(Generic[Key]):
    def __init__(
        self,
        backoff: Backoff = RETRY,
        per_second: float = RETRIES_PER_SECOND,
        burst: int = RETRY_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = backoff
        self.per_second = per_second
        self.burst = burst
        self.clock = clock
        self._failures: dict[Key, int] = {}
        self._tokens = float(burst)
        self._refilled_at = clock()

    def when(self, key: Key) -> float:
        """Seconds to wait before retrying `key`, counting this as one more failure."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        return max(self.backoff.delay(failures), self._bucket_delay())

    def _bucket_delay(self) -> float:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled_at) * self.per_second)
        self._refilled_at = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.per_second

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)


class ShutDown(TransientFault):
    """The queue was shut down; workers stop."""


class WorkQueue(Generic[Key]):
    def __init__(self, limiter: RateLimiter[Key] | None = None) -> None:
        self.limiter: RateLimiter[Key] = limiter or RateLimiter()
        self._queue: list[Key] = []
        self._queued: set[Key] = set()
        self._processing: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._ready = asyncio.Event()
        self._shut_down = False

    def add(self, key: Key) -> None:
        if self._shut_down:
            return
        self._cancel_timer(key)
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.append(key)
            self._ready.set()

    def add_after(self, key: Key, delay: float) -> None:
        """Queues `key` in `delay` seconds; an earlier pending time for the same key wins."""
        if delay <= 0:
            self.add(key)
            return
        if self._shut_down or key in self._queued:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None and pending[0] <= due:
            return
        self._cancel_timer(key)
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def add_rate_limited(self, key: Key) -> float:
        delay = self.limiter.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Key) -> None:
        self.limiter.forget(key)

    def pending_retry(self, key: Key) -> bool:
        return key in self._timers

    async def get(self) -> Key:
        while not self._queue:
            if self._shut_down:
                raise ShutDown
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.pop(0)
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shut_down(self) -> None:
        self._shut_down = True
        for key in list(self._timers):
            self._cancel_timer(key)
        self._ready.set()

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _cancel_timer(self, key: Key) -> None:
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
