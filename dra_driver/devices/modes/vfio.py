"""Mode vfio: the GPU offered whole to a virtual machine (KubeVirt and the like), bound to vfio-pci
while a claim holds it instead of to the nvidia driver.

A VM gets the GPU through its IOMMU group, so a GPU without one (the IOMMU off) is not offered,
with a note saying how to turn it on. The device's type is "vfio", which no container DeviceClass
selects: a pod asks for one through the vfio class only. Not run on real hardware yet.
"""

from collections.abc import Sequence
from typing import ClassVar

from dra_driver.devices import attributes as names
from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.gpus import gpu_identity_attributes, whole_gpu_capacity
from dra_driver.devices.model import CounterSet, Device, DeviceType
from dra_driver.devices.modes.contract import DeviceMode, Offer, PlanAsks, no_misfit, settings_as_given
from dra_driver.devices.naming import gpu_device_name
from dra_driver.devices.origins import DeviceOrigin
from dra_driver.hardware.model import Gpu

NAME = "vfio"
# The IOMMU group a VM is given the GPU through (/dev/vfio/<group>).
IOMMU_GROUP = "iommuGroup"


class VfioGpu(DeviceOrigin, frozen=True):
    """A GPU offered whole to a VM: prepare binds it to vfio-pci (claims/effects/vfio.py), and
    the VM's monitor opens it through its IOMMU group."""

    iommu_group: int

    device_type: ClassVar[DeviceType] = "vfio"
    refuses_config = "is given to a VM (mode vfio), which no sharing setting applies to"


def vfio_device(gpu: Gpu, iommu_group: int) -> Device:
    return Device(
        name=gpu_device_name(gpu),
        type="vfio",
        attributes={**gpu_identity_attributes(gpu, "vfio"), IOMMU_GROUP: iommu_group},
        capacity=whole_gpu_capacity(gpu),
    )


def _offers(gpu: Gpu, settings: GpuSettings, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    if gpu.iommu_group is None:
        notes.append(
            f"{gpu.label} has no IOMMU group, so mode vfio cannot give it to a VM; turn the IOMMU on "
            "(intel_iommu=on or amd_iommu=on on the kernel command line)"
        )
        return [], []
    return [(vfio_device(gpu, gpu.iommu_group), VfioGpu(gpu, gpu.iommu_group))], []


def _planned(gpu: Gpu, asks: PlanAsks) -> GpuSettings:
    return GpuSettings(mode=NAME)


def _serves(gpus: Sequence[Gpu], asks: PlanAsks) -> bool:
    """`plan` places pods' containers, which a GPU given to a VM does not serve."""
    return False


def _shown_by(devices: Sequence[Device]) -> bool:
    return bool(devices) and all(device.attributes.get(names.TYPE) == NAME for device in devices)


MODE = DeviceMode(
    name=NAME,
    description="one whole GPU per device, bound to vfio-pci for a VM while claimed (MIG off)",
    in_mig_mode=False,
    auto=False,
    blocks=frozenset(),
    partitions=False,
    no_spread="",
    fits=no_misfit,
    offers=_offers,
    fallback=None,
    entered=settings_as_given,
    planned=_planned,
    serves=_serves,
    not_planned=f"{NAME} gives GPUs to VMs, not to the pods plan places",
    layout_kind="whole",
    shown_by=_shown_by,
    own_attributes=frozenset({IOMMU_GROUP}),
    # No class until mode vfio has run on real hardware (docs/configuration.md shows the one to
    # create).
    unshipped_types=frozenset({VfioGpu.device_type}),
)
