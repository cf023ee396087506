"""What each published device stands for, as typed facts (pure).

The published attributes are a contract with users (their CEL selectors name them), so they may
be renamed or dropped for users' sake. Prepare must therefore never read them back: it reads the
origin the inventory recorded when it built the device, which carries everything prepare needs
(the GPU, the MIG profile and placement, the partition size) in the types the hardware speaks.

Every origin is a DeviceOrigin: a mode's own kind (devices/modes/vfio.py's) subclasses it in its
module, and code that has no case for a kind treats it as its GPU whole (its default).
"""

from typing import ClassVar

import msgspec

from dra_driver.devices.model import DeviceType
from dra_driver.hardware.model import Gpu, MigInstance, MigProfile, Placement


class DeviceOrigin(msgspec.Struct, frozen=True):
    """The root of the origins: the GPU the device is on, and the device's type."""

    gpu: Gpu

    device_type: ClassVar[DeviceType]
    # Why no opaque config applies to a device of this kind ("": the type's config does).
    refuses_config: ClassVar[str] = ""


class WholeGpu(DeviceOrigin, frozen=True):
    """A GPU offered whole (mode gpu, or the whole-GPU device next to vGPU partitions)."""

    device_type: ClassVar[DeviceType] = "gpu"


class StaticMig(DeviceOrigin, frozen=True):
    """A MIG instance that already exists (mode mig-static): prepare uses it, never creates it."""

    profile: MigProfile
    instance: MigInstance

    device_type: ClassVar[DeviceType] = "mig"


class DynamicMig(DeviceOrigin, frozen=True):
    """A placement where prepare creates an instance of the profile (mode mig-dynamic)."""

    profile: MigProfile
    placement: Placement

    device_type: ClassVar[DeviceType] = "mig"


class VgpuShare(DeviceOrigin, frozen=True):
    """The GPU shared by consumable capacity (mode vgpu-capacity): each claim takes its amount."""

    memory_step: int

    device_type: ClassVar[DeviceType] = "vgpu"


class VgpuPartition(DeviceOrigin, frozen=True):
    """One fixed-size slot of a GPU's memory and cores (mode vgpu-partitions)."""

    memory_bytes: int
    cores: int
    slot: int

    device_type: ClassVar[DeviceType] = "vgpu"
