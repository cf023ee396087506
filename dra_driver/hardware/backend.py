"""The interface every hardware backend offers to the node agent."""

from typing import Protocol

from dra_driver.hardware.model import Gpu


class HardwareBackend(Protocol):
    @property
    def description(self) -> str:
        """One line for logs and `inspect`: which backend, which node profile or library."""
        ...

    async def discover(self) -> tuple[Gpu, ...]:
        """The node's GPUs ordered by NVML index; blocking work happens off the event loop."""
        ...

    async def close(self) -> None: ...
