"""What a pod asks for, per offering mode: one trace of needs, asked the way each mode can serve.

A trace (`plan --trace` format) says what each pod needs in the words users use: whole GPUs
(`gpu`, `gpu:8`), a MIG profile, or a vGPU share of memory and cores. A fleet in one mode can
serve each need only one way, so each is translated the way an operator would tell its users:
- gpu (a device plugin's whole GPUs): everything takes whole GPUs, a fraction takes one;
- mig-dynamic: a share takes the smallest profile holding its memory and cores, whole GPUs take
  the full-GPU profile each (a MIG GPU offers no whole device);
- vgpu-capacity / vgpu-partitions: a MIG profile takes a share of its memory and compute
  fraction; whole GPUs are claims of no capacity (capacity mode: the defaults, all of the GPU)
  or of the whole-GPU device (partitions mode);
- native (the mixed fleet): as written; the scheduler finds the nodes that offer it.

A need becomes both an API request (class, CEL selector, capacity requests) and the allocator
model's claim, from the same fields, so the two are asked the same question.
"""

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from dra_driver.devices import attributes as names
from dra_driver.devices.classes import class_name
from dra_driver.devices.model import Device, DeviceType, quantity
from dra_driver.hardware.model import Gpu, MigProfile
from dra_driver.packing.allocator import Claim, Request
from dra_driver.packing.shapes import PodShape

Mode = Literal["gpu", "mig-dynamic", "vgpu-capacity", "vgpu-partitions", "native"]
ALL_CORES = 100
GIB = 2**30
REQUEST = "devices"


class Need(msgspec.Struct, frozen=True):
    """One pod's one request: `count` devices of `device_type`; a MIG profile; a share's memory
    (0: no capacity asked) and cores (None: not asked)."""

    device_type: DeviceType
    count: int = 1
    profile: str = ""
    memory_bytes: int = 0
    cores: int | None = None

    @property
    def label(self) -> str:
        if self.device_type == "mig":
            return self.profile if self.count == 1 else f"{self.count}x{self.profile}"
        if self.memory_bytes:
            cores = "" if self.cores is None else f"/{self.cores}%"
            return f"vgpu:{quantity(self.memory_bytes)}{cores}"
        return f"{self.device_type}:{self.count}" if self.count > 1 else self.device_type

    def api_request(self, driver: str) -> dict[str, object]:
        request: dict[str, object] = {
            "deviceClassName": class_name(self.device_type, driver),
            "count": self.count,
        }
        if self.profile:
            expression = f'device.attributes["{driver}"].{names.PROFILE} == "{self.profile}"'
            request["selectors"] = [{"cel": {"expression": expression}}]
        if self.memory_bytes:
            capacity = {"memory": quantity(self.memory_bytes)}
            if self.cores is not None:
                capacity["cores"] = str(self.cores)
            request["capacity"] = {"requests": capacity}
        return request

    def model_claim(self) -> Claim:
        capacity: dict[str, int] = {}
        if self.memory_bytes:
            capacity["memory"] = self.memory_bytes
            if self.cores is not None:
                capacity["cores"] = self.cores
        return Claim((Request(REQUEST, _selector(self.device_type, self.profile), self.count, capacity),))


@functools.cache
def _selector(device_type: str, profile: str) -> Callable[[Device], bool]:
    """One predicate per (type, profile): the model caches candidate devices per selector."""

    def selected(device: Device) -> bool:
        return device.attributes.get(names.TYPE) == device_type and (
            not profile or device.attributes.get(names.PROFILE) == profile
        )

    return selected


def _plain(profiles: Sequence[MigProfile]) -> list[MigProfile]:
    """Profiles without media-engine variants (`+me`, `-me`): what a share would be given."""
    return [profile for profile in profiles if "+" not in profile.name and "-" not in profile.name]


def _full_profile(gpu: Gpu) -> MigProfile:
    return max(_plain(gpu.mig_profiles), key=lambda p: (p.compute_slices, p.memory_bytes))


def _cores_of(profile: MigProfile, gpu: Gpu) -> int:
    return math.ceil(profile.compute_slices * ALL_CORES / _full_profile(gpu).compute_slices)


def _fitting_profile(shape: PodShape, gpu: Gpu) -> MigProfile:
    """The smallest profile holding the share's memory and cores; the full GPU if none does."""
    fitting = [
        profile
        for profile in _plain(gpu.mig_profiles)
        if profile.memory_bytes >= shape.memory_bytes
        and _cores_of(profile, gpu) >= (shape.cores or ALL_CORES)
    ]
    return min(fitting, key=lambda p: (p.memory_bytes, p.compute_slices)) if fitting else _full_profile(gpu)


def _share_of(profile_name: str, gpu: Gpu) -> Need:
    """The profile's memory rounded up to whole GiB (the shares users write), unless that is more
    than the full-GPU profile holds, and its fraction of the compute slices."""
    profile = next((p for p in gpu.mig_profiles if p.name == profile_name), None)
    if profile is None:
        raise ValueError(f"MIG profile {profile_name!r}: not offered by {gpu.product_name}")
    memory = -(-profile.memory_bytes // GIB) * GIB
    if memory > _full_profile(gpu).memory_bytes:
        memory = profile.memory_bytes
    return Need("vgpu", memory_bytes=memory, cores=_cores_of(profile, gpu))


def need_for(shape: PodShape, mode: Mode, gpu: Gpu | None) -> Need:
    """How a fleet in `mode`, of GPUs like `gpu` (None for native), serves `shape`."""
    whole = shape.devices if shape.kind == "gpu" else 1
    if mode == "native" or gpu is None:
        if shape.kind == "mig":
            return Need("mig", profile=shape.profile)
        if shape.kind == "vgpu":
            return Need("vgpu", memory_bytes=shape.memory_bytes, cores=shape.cores)
        return Need("gpu", count=whole)
    if mode == "gpu":
        return Need("gpu", count=whole)
    if mode == "mig-dynamic":
        if shape.kind == "mig":
            return Need("mig", profile=shape.profile)
        if shape.kind == "vgpu":
            return Need("mig", profile=_fitting_profile(shape, gpu).name)
        return Need("mig", count=whole, profile=_full_profile(gpu).name)
    if shape.kind == "mig":
        return _share_of(shape.profile, gpu)
    if shape.kind == "vgpu":
        return Need("vgpu", memory_bytes=shape.memory_bytes, cores=shape.cores)
    return Need("vgpu" if mode == "vgpu-capacity" else "gpu", count=whole)
