"""The interface every hardware backend offers to the node agent."""

from typing import Protocol

from dra_driver.hardware.model import ComputeMode, Gpu, MigInstance, Placement


class HardwareBackend(Protocol):
    @property
    def description(self) -> str:
        """One line for logs and `inspect`: which backend, which node profile or library."""
        ...

    async def discover(self) -> tuple[Gpu, ...]:
        """A snapshot of the node's GPUs ordered by NVML index, MIG instances included; blocking
        work happens off the event loop."""
        ...

    async def create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        """Creates a GPU instance at exactly `placement` and one compute instance spanning it.

        Raises HardwareError with reason INVALID_ARGUMENT for a placement the profile does not
        have, INSUFFICIENT_RESOURCES when it overlaps an existing instance or the profile has no
        instances left, NOT_SUPPORTED when MIG mode is off. Nothing is left behind on failure.
        """
        ...

    async def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroys the GPU instance and its compute instances; NOT_FOUND if it does not exist."""
        ...

    async def close(self) -> None: ...


class ComputeModes(Protocol):
    """A whole GPU's compute mode, which MPS needs set to ExclusiveProcess (both backends offer it)."""

    async def compute_mode(self, gpu_uuid: str) -> ComputeMode: ...

    async def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        """Raises HardwareError naming the GPU on failure (NOT_FOUND for an unknown GPU)."""
        ...
