"""What each published device stands for, as typed facts (pure).

The published attributes are a contract with users (their CEL selectors name them), so they may
be renamed or dropped for users' sake. Prepare must therefore never read them back: it reads the
origin the inventory recorded when it built the device, which carries everything prepare needs
(the GPU, the MIG profile and placement, the partition size) in the types the hardware speaks.
"""

from typing import ClassVar

import msgspec

from dra_driver.devices.model import DeviceType
from dra_driver.hardware.model import Gpu, MigInstance, MigProfile, Placement


class WholeGpu(msgspec.Struct, frozen=True):
    """A GPU offered whole (mode gpu, or the whole-GPU device next to vGPU partitions)."""

    gpu: Gpu

    device_type: ClassVar[DeviceType] = "gpu"


class VfioGpu(msgspec.Struct, frozen=True):
    """A GPU offered whole to a VM (mode vfio): prepare binds it to vfio-pci."""

    gpu: Gpu
    iommu_group: int

    device_type: ClassVar[DeviceType] = "vfio"


class StaticMig(msgspec.Struct, frozen=True):
    """A MIG instance that already exists (mode mig-static): prepare uses it, never creates it."""

    gpu: Gpu
    profile: MigProfile
    instance: MigInstance

    device_type: ClassVar[DeviceType] = "mig"


class DynamicMig(msgspec.Struct, frozen=True):
    """A placement where prepare creates an instance of the profile (mode mig-dynamic)."""

    gpu: Gpu
    profile: MigProfile
    placement: Placement

    device_type: ClassVar[DeviceType] = "mig"


class VgpuShare(msgspec.Struct, frozen=True):
    """The GPU shared by consumable capacity (mode vgpu-capacity): each claim takes its amount."""

    gpu: Gpu
    memory_step: int

    device_type: ClassVar[DeviceType] = "vgpu"


class VgpuPartition(msgspec.Struct, frozen=True):
    """One fixed-size slot of a GPU's memory and cores (mode vgpu-partitions)."""

    gpu: Gpu
    memory_bytes: int
    cores: int
    slot: int

    device_type: ClassVar[DeviceType] = "vgpu"


DeviceOrigin = WholeGpu | VfioGpu | StaticMig | DynamicMig | VgpuShare | VgpuPartition
