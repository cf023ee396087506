"""Polling for conditions that another process makes true."""

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
