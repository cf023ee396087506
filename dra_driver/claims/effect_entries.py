"""What a claim's record says of each side effect: one tagged entry per change on the node.

An entry holds what undoing the change needs and no more, because it is written before the change
is made (the record protocol, engine.py): what the change itself needs (a time slice's interval,
an MPS daemon's settings) travels in the effect's action (`claims/effects/`) and is not kept. The
tag is the entry's name on disk, so a record names its effects without a field per kind.
Pure, like the record model that holds them.
"""

from typing import Annotated

import msgspec

from dra_driver.hardware.model import ComputeMode, Placement

# Field names on disk, where they are not the camel case of the Python name (the records of
# release 0.1.0 spelled them so; record_codec).
_DISK_NAMES = {
    "gpu_uuid": "gpuUUID",
    "mig_device_uuid": "migDeviceUUID",
    "share_id": "shareID",
    "time_sliced_gpus": "timeSlicedGPUs",
    "mps_gpus": "mpsGPUs",
    "reserved": "reservedDevices",
    "generation": "claimGeneration",
}


def disk_name(name: str) -> str:
    """A field's name in a record file."""
    if name in _DISK_NAMES:
        return _DISK_NAMES[name]
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class EffectEntry(msgspec.Struct, frozen=True, tag_field="kind", rename=disk_name):
    """The root of the entries; never recorded itself."""


class MigInstanceEntry(EffectEntry, frozen=True, tag="mig-instance"):
    """A MIG instance a claim creates: GPU, profile and placement identify it on the GPU, so a
    crash at any point leaves enough to find and destroy it."""

    gpu_uuid: str
    profile_id: Annotated[int, msgspec.Meta(ge=0)]
    placement_start: Annotated[int, msgspec.Meta(ge=0)]
    placement_size: Annotated[int, msgspec.Meta(ge=0)]

    @property
    def placement(self) -> Placement:
        return Placement(self.placement_start, self.placement_size)


class TimeSliceEntry(EffectEntry, frozen=True, tag="time-slice"):
    """A GPU whose time slice the claim set (set back to Default when it goes)."""

    gpu_uuid: str


class ComputeModeEntry(EffectEntry, frozen=True, tag="compute-mode"):
    """A GPU whose compute mode an MPS claim set, and the mode it had before, to put back."""

    gpu_uuid: str
    restore: ComputeMode


class ClaimMpsEntry(EffectEntry, frozen=True, tag="claim-mps-daemon"):
    """The claim's own MPS control daemon (found by claim UID under the MPS directory)."""


class GpuMpsEntry(EffectEntry, frozen=True, tag="gpu-mps-share"):
    """A GPU whose MPS daemon (one per GPU, shared by its vGPU shares under vgpu.enforcement mps)
    the claim's share goes through: the last claim on the GPU to go stops the daemon."""

    gpu_uuid: str


class VfioEntry(EffectEntry, frozen=True, tag="vfio-binding"):
    """A GPU the claim took from its kernel driver and bound to vfio-pci for a VM: its PCI
    address, and the driver to give it back to."""

    pci_address: str
    restore_driver: str


# Every entry a record may hold; the codec decodes this union, so a new kind is added here.
AnyEntry = MigInstanceEntry | TimeSliceEntry | ComputeModeEntry | ClaimMpsEntry | GpuMpsEntry | VfioEntry
