"""Health events the agent's event loop iterates over, and where they come from: the common
queue and the simulated backend's injected faults. The NVML source (nvml_events.py) builds on the
same queue; it lives apart so that a node without GPUs never loads the NVML bindings.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol, Self

from dra_driver.hardware.events import GpuLost, HealthEvent, XidEvent
from dra_driver.hardware.simulated import XID_GPU_LOST, SimulatedBackend


def health_event(gpu_uuid: str, xid: int, at: float) -> HealthEvent:
    """XID 79 means the GPU fell off the bus: it is lost, not merely faulty."""
    return GpuLost(gpu_uuid, at) if xid == XID_GPU_LOST else XidEvent(gpu_uuid, xid, at)


class HealthEventSource(Protocol):
    """Where the agent gets health events: start() on the event loop, iterate, stop() to end the
    iteration."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def __aiter__(self) -> Self: ...

    async def __anext__(self) -> HealthEvent: ...


class QueuedEvents:
    """Events in arrival order from a producer; None in the queue ends every iteration."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[HealthEvent | None] = asyncio.Queue()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> HealthEvent:
        event = await self._queue.get()
        if event is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return event


class SimulatedEvents(QueuedEvents):
    """The simulated backend's injected XIDs (`raise_xid`, `lose_gpu`), collected every
    `interval_seconds` as the NVML source would deliver them."""

    def __init__(
        self, backend: SimulatedBackend, interval_seconds: float = 1.0, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__()
        self._backend = backend
        self._interval_seconds = interval_seconds
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._queue.put_nowait(None)

    async def _poll(self) -> None:
        while True:
            for event in self._backend.take_events():
                self._queue.put_nowait(health_event(event.gpu_uuid, event.xid, self._clock()))
            await asyncio.sleep(self._interval_seconds)
