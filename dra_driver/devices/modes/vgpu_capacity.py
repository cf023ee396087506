"""Mode vgpu-capacity: the GPU as one shareable device whose `memory` and `cores` each claim takes
a part of (KEP-5075 consumable capacity; devices.vgpu)."""

from collections.abc import Sequence

from dra_driver.devices.gpu_settings import MIB, GpuSettings, describe_gpu
from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.modes import mig_dynamic, vgpu_partitions
from dra_driver.devices.modes.contract import (
    DeviceMode,
    Fallback,
    Offer,
    PlanAsks,
    Unfit,
    always,
    settings_as_given,
)
from dra_driver.devices.origins import VgpuShare
from dra_driver.devices.vgpu import shareable_gpu_device
from dra_driver.hardware.model import Gpu

NAME = "vgpu-capacity"


def _fits(gpu: Gpu, settings: GpuSettings, where: str) -> Unfit | None:
    if settings.memory_step > gpu.memory_bytes:
        return Unfit(
            f"{where}.vgpu.memoryStep",
            f"{settings.memory_step // MIB}Mi is more than {describe_gpu(gpu)} has",
        )
    return None


def _offers(gpu: Gpu, settings: GpuSettings, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    step = settings.memory_step
    return [(shareable_gpu_device(gpu, step, settings.enforcement), VgpuShare(gpu, step))], []


def _planned(gpu: Gpu, asks: PlanAsks) -> GpuSettings:
    return GpuSettings(mode=NAME)


def _shown_by(devices: Sequence[Device]) -> bool:
    shared = any(device.allow_multiple_allocations for device in devices)
    return shared and vgpu_partitions.shows_vgpu(devices)


MODE = DeviceMode(
    name=NAME,
    description="one shareable device that claims take memory and cores from (MIG off)",
    in_mig_mode=False,
    auto=False,
    blocks=frozenset({"vgpu"}),
    partitions=False,
    no_spread=(
        f"spread needs a device per tenant slot (mode {vgpu_partitions.NAME} or {mig_dynamic.NAME}); "
        f"with {NAME} each GPU is one device and the scheduler fills the first GPU that fits"
    ),
    fits=_fits,
    offers=_offers,
    # Capacity mode needs no shared counters, so only consumable capacity being off moves it, and
    # it lands on partitions, which then need shared counters in their turn.
    fallback=Fallback(vgpu_partitions.NAME, "DRAConsumableCapacity"),
    entered=settings_as_given,
    planned=_planned,
    serves=always,
    not_planned=f"cannot be offered as {NAME}",
    layout_kind=NAME,
    shown_by=_shown_by,
    own_attributes=frozenset(),
    unshipped_types=frozenset(),
)
