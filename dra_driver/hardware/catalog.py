"""The GPU catalog: the packaged facts about each GPU model that both backends and the tests use.

Memory, SMs, MIG geometry and every MIG profile's engines and placements, as NVML reports them on
the real GPU. The simulated backend builds its GPUs from them, and the NVML backend falls back on
their SM counts where a driver will not report a whole GPU's. The facts are packaged as
catalog/gpus.yaml, which hack/build-catalog.py generates from the hand-researched catalog.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from typing import Any

import yaml

from dra_driver.hardware.model import HardwareError, MigProfile, Placement

_MIB = 2**20


@dataclass(frozen=True, slots=True)
class MigResources:
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
        nothing = cls(*(0 for _ in fields(cls)))
        return sum((cls.of(profile) for profile in profiles), nothing)

    def __add__(self, other: "MigResources") -> "MigResources":
        return MigResources(
            *(mine + theirs for mine, theirs in zip(self.amounts(), other.amounts(), strict=True))
        )

    def amounts(self) -> tuple[int, ...]:
        return tuple(getattr(self, field.name) for field in fields(self))

    def exceeding(self, capacity: "MigResources") -> list[str]:
        """'<resource> <needed> > <capacity>' for every resource this needs more of than there is."""
        return [
            f"{field.name.replace('_', ' ')} {needed} > {available}"
            for field, needed, available in zip(fields(self), self.amounts(), capacity.amounts(), strict=True)
            if needed > available
        ]


@dataclass(frozen=True, slots=True)
class MigGeometry:
    memory_slices: int
    max_gpu_instances: int
    profiles: tuple[MigProfile, ...]
    # What all instances together may use: the engines and SMs of the full-GPU profile (the one
    # with the most compute slices) and the GPU's memory.
    capacity: MigResources

    def profile(self, profile_id: int) -> MigProfile | None:
        return next((profile for profile in self.profiles if profile.profile_id == profile_id), None)

    def profile_named(self, name: str) -> MigProfile | None:
        return next((profile for profile in self.profiles if profile.name == name), None)


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_mib: int
    multiprocessors: int
    # None for GPUs without MIG (NVML answers NOT_SUPPORTED for their MIG mode).
    mig: MigGeometry | None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * _MIB


def read_packaged_yaml(name: str) -> dict[str, Any]:
    """A YAML file of the catalog/ folder beside this module (the folder is data, not a package)."""
    text = resources.files("dra_driver.hardware").joinpath("catalog", name).read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise HardwareError(f"packaged catalog {name} is not a mapping; the package is damaged")
    return loaded


def _catalog_profile(raw: dict[str, Any]) -> MigProfile:
    return MigProfile(
        profile_id=raw["id"],
        nvml_enum=raw["nvmlEnum"],
        name=raw["name"],
        compute_slices=raw["computeSlices"],
        memory_bytes=raw["memoryMiB"] * _MIB,
        multiprocessors=raw["multiprocessors"],
        copy_engines=raw["copyEngines"],
        decoders=raw["decoders"],
        encoders=raw["encoders"],
        jpeg_engines=raw["jpegEngines"],
        ofa_engines=raw["ofaEngines"],
        max_instances=raw["maxInstances"],
        placements=tuple(Placement(start, size) for start, size in raw["placements"]),
    )


def mig_capacity(profiles: Sequence[MigProfile], gpu_memory_bytes: int) -> MigResources:
    """The full-GPU profile is the only published statement of what the whole GPU has; memory is
    the GPU's own total because the full-GPU profile leaves some of it unusable."""
    full_gpu = max(profiles, key=lambda profile: profile.compute_slices)
    return replace(MigResources.of(full_gpu), memory_bytes=gpu_memory_bytes)


def _catalog_model(key: str, raw: dict[str, Any]) -> GpuModel:
    mig = None
    if "mig" in raw:
        profiles = tuple(_catalog_profile(profile) for profile in raw["mig"]["profiles"])
        mig = MigGeometry(
            memory_slices=raw["mig"]["memorySlices"],
            max_gpu_instances=raw["mig"]["maxGpuInstances"],
            profiles=profiles,
            capacity=mig_capacity(profiles, raw["memoryMiB"] * _MIB),
        )
    return GpuModel(
        key=key,
        product_name=raw["productName"],
        brand=raw["brand"],
        architecture=raw["architecture"],
        cuda_compute_capability=raw["cudaComputeCapability"],
        memory_mib=raw["memoryMiB"],
        multiprocessors=raw["multiprocessors"],
        mig=mig,
    )


@cache
def gpu_models() -> Mapping[str, GpuModel]:
    """The packaged catalog (generated by hack/build-catalog.py), keyed by model key."""
    return {key: _catalog_model(key, raw) for key, raw in read_packaged_yaml("gpus.yaml").items()}
