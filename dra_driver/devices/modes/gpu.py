"""Mode gpu: the GPU offered whole, as one device (also what mode auto makes of a GPU not in MIG
mode, and what `plan` offers a GPU that cannot be offered in the mode asked for)."""

from collections.abc import Sequence

from dra_driver.devices import attributes as names
from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.gpus import whole_gpu_device
from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.modes.contract import (
    DeviceMode,
    Offer,
    PlanAsks,
    always,
    no_misfit,
    settings_as_given,
)
from dra_driver.devices.origins import WholeGpu
from dra_driver.hardware.model import Gpu

NAME = "gpu"


def _offers(gpu: Gpu, settings: GpuSettings, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    return [(whole_gpu_device(gpu), WholeGpu(gpu))], []


def _planned(gpu: Gpu, asks: PlanAsks) -> GpuSettings:
    return GpuSettings(mode=NAME)


def _shown_by(devices: Sequence[Device]) -> bool:
    return all(device.attributes.get(names.TYPE) == "gpu" for device in devices)


MODE = DeviceMode(
    name=NAME,
    description="one whole device per GPU (MIG off)",
    in_mig_mode=False,
    auto=True,
    blocks=frozenset(),
    partitions=False,
    no_spread="",
    fits=no_misfit,
    offers=_offers,
    fallback=None,
    entered=settings_as_given,
    planned=_planned,
    serves=always,
    not_planned=f"cannot be offered as {NAME}",
    layout_kind="whole",
    shown_by=_shown_by,
    own_attributes=frozenset(),
    unshipped_types=frozenset(),
)
