"""Mode vgpu-partitions: fixed-size vGPU partitions of the sizes configured, plus the whole GPU,
all drawing from one counter set (KEP-4815 partitionable devices; devices.vgpu)."""

from collections.abc import Sequence

from msgspec.structs import replace

from dra_driver.devices import attributes as names
from dra_driver.devices.gpu_settings import MIB, GpuSettings, VgpuPartitionSize, describe_gpu
from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.modes import gpu as whole
from dra_driver.devices.modes.contract import DeviceMode, Fallback, Offer, PlanAsks, Unfit
from dra_driver.devices.origins import WholeGpu
from dra_driver.devices.vgpu import (
    partitioned_whole_gpu_device,
    vgpu_counter_set,
    vgpu_partition_device,
    vgpu_partition_origins,
)
from dra_driver.hardware.model import Gpu

NAME = "vgpu-partitions"
GIB = 2**30


def _fits(gpu: Gpu, settings: GpuSettings, where: str) -> Unfit | None:
    sizes = set()
    for number, partition in enumerate(settings.partitions):
        setting = f"{where}.vgpu.partitions[{number}].memory"
        if partition.memory_bytes > gpu.memory_bytes:
            return Unfit(
                setting,
                f"{partition.memory_bytes // MIB}Mi does not fit {describe_gpu(gpu)}, "
                f"which has {gpu.memory_bytes // MIB}Mi",
            )
        if partition.memory_bytes in sizes:
            return Unfit(setting, f"two partition sizes with the same memory on {describe_gpu(gpu)}")
        sizes.add(partition.memory_bytes)
    return None


def _offers(gpu: Gpu, settings: GpuSettings, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    enforcement = settings.enforcement
    offers: list[Offer] = [(partitioned_whole_gpu_device(gpu), WholeGpu(gpu))]
    offers += [
        (vgpu_partition_device(origin, enforcement), origin)
        for origin in vgpu_partition_origins(gpu, settings.partitions, enforcement)
    ]
    return offers, [vgpu_counter_set(gpu, enforcement)]


def default_partition_sizes(gpu: Gpu) -> tuple[VgpuPartitionSize, ...]:
    """Sizes for a GPU configured for capacity mode, which names none: a half, a quarter and an
    eighth of its memory in whole GiB cover large and small requests alike. A size that rounds to
    0 is left out; the others always differ, as each is at least twice the next."""
    sizes = (gpu.memory_bytes // divisor // GIB * GIB for divisor in (2, 4, 8))
    return tuple(VgpuPartitionSize(memory_bytes) for memory_bytes in sizes if memory_bytes)


def _entered(gpu: Gpu, settings: GpuSettings) -> GpuSettings:
    return settings if settings.partitions else replace(settings, partitions=default_partition_sizes(gpu))


def _partition_sizes(asks: PlanAsks, gpu: Gpu) -> tuple[VgpuPartitionSize, ...]:
    """One partition size per vGPU memory size asked for, with the most cores any of its pods
    asks for (None: its share of the GPU), so every vGPU shape has a partition that fits it."""
    cores: dict[int, int | None] = {}
    for memory_bytes, shape_cores in asks.vgpus:
        if memory_bytes > gpu.memory_bytes:
            continue
        memory = -(-memory_bytes // MIB) * MIB
        asked = [c for c in (cores.get(memory), shape_cores) if c is not None]
        cores[memory] = max(asked) if asked else None
    return tuple(VgpuPartitionSize(memory, cores[memory]) for memory in sorted(cores))


def _planned(gpu: Gpu, asks: PlanAsks) -> GpuSettings | None:
    sizes = _partition_sizes(asks, gpu)
    return GpuSettings(mode=NAME, partitions=sizes) if sizes else None


def _serves(gpus: Sequence[Gpu], asks: PlanAsks) -> bool:
    """Only vGPU shapes say which sizes to cut."""
    return bool(asks.vgpus)


def shows_vgpu(devices: Sequence[Device]) -> bool:
    return any(device.attributes.get(names.TYPE) == "vgpu" for device in devices)


def _shown_by(devices: Sequence[Device]) -> bool:
    return shows_vgpu(devices) and not any(device.allow_multiple_allocations for device in devices)


MODE = DeviceMode(
    name=NAME,
    description="fixed-size partitions of the sizes configured, plus the whole GPU (MIG off)",
    in_mig_mode=False,
    auto=False,
    blocks=frozenset({"vgpu"}),
    partitions=True,
    no_spread="",
    fits=_fits,
    offers=_offers,
    fallback=Fallback(whole.NAME, "DRAPartitionableDevices"),
    entered=_entered,
    planned=_planned,
    serves=_serves,
    not_planned=f"cannot be offered as {NAME}",
    layout_kind=NAME,
    shown_by=_shown_by,
    own_attributes=frozenset(),
    unshipped_types=frozenset(),
)
