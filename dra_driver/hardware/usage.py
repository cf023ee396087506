"""What a GPU is being used for right now: memory, utilisation and the processes on it.

Read by the usage sampler on a thread of its own, never on the NVML thread that prepare uses, so
a read that hangs in the driver cannot hold up a pod's start. Every backend answers the same
shape; a value the hardware cannot tell (utilisation of a MIG device, per-process samples on an
older driver) is None rather than a guess.
"""

from typing import Protocol

import msgspec


class ProcessUsage(msgspec.Struct, frozen=True):
    pid: int
    # None: the driver does not account memory per process (NVML_VALUE_NOT_AVAILABLE).
    memory_bytes: int | None
    # SM utilisation of the process over the last sampling window, 0-100; None: no sample.
    sm_percent: float | None = None


class DeviceUsage(msgspec.Struct, frozen=True):
    """One whole GPU (`mig_uuid` None) or one MIG device of it."""

    gpu_uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    # Device utilisation over the driver's last sample period, 0-100; None where NVML has none.
    utilization_percent: float | None
    processes: tuple[ProcessUsage, ...] = ()
    mig_uuid: str | None = None
    # Where the MIG device's GPU instance starts on its GPU: how a claim's MIG device is found
    # again (a dynamic instance's UUID is not known before it exists; its placement is).
    mig_placement_start: int | None = None


class UsageReader(Protocol):
    def read_usage(self) -> tuple[DeviceUsage, ...]:
        """Blocking: every GPU of the node and every MIG device on it. Called from a thread."""
        ...

    def close(self) -> None: ...
