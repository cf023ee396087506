"""One retry schedule for every loop that waits before trying again.

Doubling from `first` up to `cap`, optionally spread by `jitter` so that many retries after one
outage do not arrive in step. Pure (the random source is a field, a test passes its own), and in
the bottom package because hardware/ and state/ retry too and must not import kube/.
"""

import random
from collections.abc import Callable

import msgspec

# 2**64 times any sensible `first` is far beyond any cap; bounding the exponent keeps a very long
# outage's failure count from overflowing the float.
_LONGEST_DOUBLING = 64


class Backoff(msgspec.Struct, frozen=True):
    """`first`: the wait after the first failure; `cap`: the longest wait; `jitter`: the share by
    which a wait may differ either way (0.2: within +-20 %); `uniform`: where the spread comes from,
    a number in [0, 1)."""

    first: float
    cap: float
    jitter: float = 0.0
    uniform: Callable[[], float] = random.random

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"Backoff: expected 0 < first <= cap, got first={self.first}, cap={self.cap}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"Backoff: expected 0 <= jitter < 1, got {self.jitter}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` failures in a row (1 for the first)."""
        doublings = min(max(failures, 1) - 1, _LONGEST_DOUBLING)
        wait = min(self.cap, self.first * 2.0**doublings)
        if not self.jitter:
            return wait
        return wait * (1.0 + self.jitter * (2.0 * self.uniform() - 1.0))
