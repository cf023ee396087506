"""A signal during start-up cancels it wherever it waits, and what the cancelled phase opened
is closed again (node_process.started_unless_stopped)."""

import asyncio
import signal

import pytest

from dra_driver.agent.errors import StartupError
from dra_driver.agent.node_process import started_unless_stopped


async def _race(start_after: float, signal_after: float | None, opened: list[str]) -> str | None:
    loop = asyncio.get_running_loop()
    termination: asyncio.Future[signal.Signals] = loop.create_future()
    if signal_after is not None:
        loop.call_later(signal_after, termination.set_result, signal.SIGTERM)

    async def start() -> str:
        opened.append("hardware")
        try:
            await asyncio.sleep(start_after)  # a long phase: discovery, the driver's wait
        except BaseException:
            opened.remove("hardware")
            raise
        return "agent"

    return await started_unless_stopped(start(), termination)


async def test_a_signal_during_a_long_phase_cancels_it_and_its_phase_closes_what_it_opened() -> None:
    opened: list[str] = []
    began = await asyncio.wait_for(_race(3600, 0.01, opened), 5)
    assert (began, opened) == (None, [])


async def test_a_start_that_ends_first_returns_the_agent() -> None:
    opened: list[str] = []
    assert await _race(0.0, None, opened) == "agent"
    assert opened == ["hardware"]


async def test_a_failing_start_fails_as_before() -> None:
    loop = asyncio.get_running_loop()

    async def start() -> str:
        raise StartupError("no")

    with pytest.raises(StartupError, match="no"):
        await started_unless_stopped(start(), loop.create_future())
