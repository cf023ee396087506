"""Waiting for the NVIDIA driver to appear under the driver root.

With the GPU Operator, the driver container installs the driver after the node's other pods have
started, this agent included. Exiting would only have kubelet restart the agent with its own,
growing back-off and a crash-looping pod for the operator to worry about; so the agent says once
what it is waiting for, and looks again on a capped exponential schedule.
"""

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import structlog

from dra_driver.base.backoff import Backoff
from dra_driver.hardware.nvml_library import LIBRARY, NvmlLibraryNotFound, load_nvml_library

log = structlog.get_logger("dra_driver.hardware")

RETRY = Backoff(first=1.0, cap=60.0)


def retry_delays(backoff: Backoff = RETRY) -> Iterator[float]:
    """1, 2, 4, ... seconds, then 60 for ever."""
    return (backoff.delay(failures) for failures in itertools.count(1))


async def wait_for_nvml_library(
    driver_root: Path,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    delays: Iterator[float] | None = None,
) -> str:
    """Returns where the library was loaded from, once it can be; logs one line while it cannot."""
    waited = False
    schedule = delays or retry_delays()
    while True:
        try:
            found = await asyncio.to_thread(load_nvml_library, driver_root)
        except NvmlLibraryNotFound as error:
            delay = next(schedule)
            if not waited:
                log.warning(
                    f"the NVIDIA driver is not there yet: {LIBRARY} cannot be loaded from driver root "
                    f"{driver_root}; looking again with back-off (from {RETRY.first:g} s up to "
                    f"every {RETRY.cap:g} s)",
                    tried=[str(attempt) for attempt in error.attempts],
                )
                waited = True
            else:
                log.debug("NVIDIA driver still missing", driver_root=str(driver_root), retry_in_seconds=delay)
            await sleep(delay)
            continue
        if waited:
            log.info("the NVIDIA driver has appeared; starting", library=found)
        return found
