"""What the hardware reports about a GPU's health: the events both backends raise.

They live here, with the hardware that raises them, so that the hardware layer imports nothing
above it; the health tracker above turns them into each GPU's condition.
"""

import msgspec


class XidEvent(msgspec.Struct, frozen=True):
    """The driver reported `xid` for the GPU at `at` (Unix seconds)."""

    gpu_uuid: str
    xid: int
    at: float


class GpuLost(msgspec.Struct, frozen=True):
    """The GPU stopped answering (XID 79, or NVML's GPU_IS_LOST) at `at`."""

    gpu_uuid: str
    at: float


HealthEvent = XidEvent | GpuLost
