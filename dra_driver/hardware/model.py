"""The hardware facts the rest of the driver works from.

Frozen and free of Kubernetes so that device planning stays a pure function of these values,
whichever backend (NVML or simulated) produced them.
"""

import enum
from collections.abc import Iterable, Sequence
from typing import ClassVar, Literal

import msgspec
from msgspec.structs import replace

from dra_driver.base.errors import TransientFault
from dra_driver.observability.error_reasons import ErrorReason

# The time slice a GPU gives each process in turn, as the driver names its levels; opaque configs
# ask for one, and the hardware layer sets it.
TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]
# A GPU's compute mode (NVML's nvmlComputeMode_t): who may make CUDA contexts on it. MPS wants
# ExclusiveProcess, so that its server is the GPU's one context (NVIDIA's MPS documentation).
ComputeMode = Literal["Default", "ExclusiveThread", "Prohibited", "ExclusiveProcess"]


class TimeSliceSetting(msgspec.Struct, frozen=True):
    """A GPU's time slice to set: what a claim's sharing plan asks of the hardware."""

    gpu_uuid: str
    interval: TimeSliceInterval


class HardwareErrorReason(enum.Enum):
    """Why a hardware call failed, in NVML's terms, so callers can react without parsing text."""

    INVALID_ARGUMENT = "invalid-argument"
    NOT_SUPPORTED = "not-supported"
    INSUFFICIENT_RESOURCES = "insufficient-resources"
    NOT_FOUND = "not-found"
    GPU_LOST = "gpu-lost"
    NO_PERMISSION = "no-permission"
    LIBRARY_NOT_FOUND = "library-not-found"
    OTHER = "other"


class HardwareError(TransientFault):
    """The hardware (or its simulation) could not be read or did not answer as expected."""

    metric_reason: ClassVar[ErrorReason] = "hardware"

    def __init__(self, message: str, reason: HardwareErrorReason = HardwareErrorReason.OTHER) -> None:
        super().__init__(message)
        self.reason = reason


class MigMode(enum.Enum):
    UNSUPPORTED = "unsupported"
    DISABLED = "disabled"
    ENABLED = "enabled"


class Placement(msgspec.Struct, frozen=True, order=True):
    """Where a GPU instance sits, in memory slices: it occupies [start, start + size)."""

    start: int
    size: int

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)


class MigProfile(msgspec.Struct, frozen=True):
    """A GPU instance profile as NVML describes it (nvmlGpuInstanceProfileInfo_t)."""

    # info.id: what `nvidia-smi mig -lgip` shows and -cgi takes; not the NVML_GPU_INSTANCE_PROFILE_* enum.
    profile_id: int
    # The NVML_GPU_INSTANCE_PROFILE_* constant the profile was queried with.
    nvml_enum: int
    name: str
    compute_slices: int
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    max_instances: int
    placements: tuple[Placement, ...]


class MigResources(msgspec.Struct, frozen=True):
    """What GPU instances draw from their GPU besides memory slices.

    NVML refuses an instance when the engines or SMs it needs are already taken, which is how a
    second "+me" instance (the one with the GPU's only OFA) is refused even with slices free.
    """

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_bytes: int

    @classmethod
    def of(cls, profile: MigProfile) -> "MigResources":
        return cls(
            multiprocessors=profile.multiprocessors,
            copy_engines=profile.copy_engines,
            decoders=profile.decoders,
            encoders=profile.encoders,
            jpeg_engines=profile.jpeg_engines,
            ofa_engines=profile.ofa_engines,
            memory_bytes=profile.memory_bytes,
        )

    @classmethod
    def total(cls, profiles: Iterable[MigProfile]) -> "MigResources":
        nothing = cls(*(0 for _ in cls.__struct_fields__))
        return sum((cls.of(profile) for profile in profiles), nothing)

    def __add__(self, other: "MigResources") -> "MigResources":
        return MigResources(
            *(mine + theirs for mine, theirs in zip(self.amounts(), other.amounts(), strict=True))
        )

    def amounts(self) -> tuple[int, ...]:
        # The field names msgspec keeps on the class: `msgspec.structs.fields` would resolve
        # every annotation on each call (33 µs here; this whole method takes 1 µs).
        return tuple(getattr(self, name) for name in self.__struct_fields__)

    def exceeding(self, capacity: "MigResources") -> list[str]:
        """'<resource> <needed> > <capacity>' for every resource this needs more of than there is."""
        return [
            f"{name.replace('_', ' ')} {needed} > {available}"
            for name, needed, available in zip(
                self.__struct_fields__, self.amounts(), capacity.amounts(), strict=True
            )
            if needed > available
        ]


def mig_capacity(profiles: Sequence[MigProfile], gpu_memory_bytes: int) -> MigResources:
    """The full-GPU profile is the only published statement of what the whole GPU has; memory is
    the GPU's own total because the full-GPU profile leaves some of it unusable."""
    full_gpu = max(profiles, key=lambda profile: profile.compute_slices)
    return replace(MigResources.of(full_gpu), memory_bytes=gpu_memory_bytes)


class MigInstance(msgspec.Struct, frozen=True):
    """An existing GPU instance together with the compute instance that makes it usable."""

    uuid: str
    profile_id: int
    placement: Placement
    gpu_instance_id: int
    compute_instance_id: int
    # Compute slices of the compute instance; smaller than the profile's when the GI is split.
    compute_slices: int
    multiprocessors: int


class Gpu(msgspec.Struct, frozen=True):
    uuid: str
    index: int
    minor: int
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str
    pcie_root: str
    # None where the platform has no NUMA affinity for the device (sysfs reports -1).
    numa_node: int | None
    driver_version: str
    cuda_driver_version: str
    mig_mode: MigMode
    # Memory slices of the GPU (8, or 4 on A30); 0 when MIG is unsupported.
    memory_slices: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    # "<cluster UUID>.<clique ID>" where NVML reports an NVLink fabric clique (e.g. GB200 NVL).
    fabric_clique: str | None = None
    # The IOMMU group the kernel put the GPU in (None: the IOMMU is off), for mode vfio.
    iommu_group: int | None = None

    @property
    def label(self) -> str:
        """How messages name a GPU: the index people use, and the UUID that is unambiguous."""
        return f"GPU {self.index} ({self.uuid})"

    def mig_profile(self, profile_id: int) -> MigProfile | None:
        return next((profile for profile in self.mig_profiles if profile.profile_id == profile_id), None)
