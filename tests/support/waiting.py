"""Polling for conditions that another process makes true."""

import asyncio
import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


async def until(condition: Callable[[], bool], within: float = 10.0) -> None:
    """`wait_until` for a condition another thread makes true while this event loop keeps running."""
    try:
        async with asyncio.timeout(within):
            while not condition():  # noqa: ASYNC110 - set by another thread, which has no event to set
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"condition not met within {within} s") from None
