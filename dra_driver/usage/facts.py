"""What each published device stands for, in the terms usage is measured in (pure): which GPU or
MIG device NVML reports it as, and how much memory and compute a claim on it may use."""

from collections.abc import Mapping

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.origins import DeviceOrigin, DynamicMig, StaticMig, VgpuPartition
from dra_driver.hardware.model import Gpu
from dra_driver.usage.attribution import DeviceFacts


def _share_of(part: int, gpu: Gpu) -> float:
    return part / gpu.multiprocessors if gpu.multiprocessors else 0.0


def device_facts_of(origin: DeviceOrigin) -> DeviceFacts:
    gpu = origin.gpu
    match origin:
        case VgpuPartition(memory_bytes=memory, cores=cores):
            return DeviceFacts(gpu.index, gpu.uuid, gpu.product_name, (gpu.uuid, None), memory, cores / 100)
        case StaticMig(profile=profile, instance=instance):
            return DeviceFacts(
                gpu.index,
                gpu.uuid,
                gpu.product_name,
                (gpu.uuid, instance.placement.start),
                profile.memory_bytes,
                _share_of(instance.multiprocessors, gpu),
            )
        case DynamicMig(profile=profile, placement=placement):
            return DeviceFacts(
                gpu.index,
                gpu.uuid,
                gpu.product_name,
                (gpu.uuid, placement.start),
                profile.memory_bytes,
                _share_of(profile.multiprocessors, gpu),
            )
        case _:
            # The GPU whole: a whole GPU, a capacity-mode share (its own grant is on its claim
            # record) and any mode's kind that has no case here (a GPU given to a VM).
            return DeviceFacts(gpu.index, gpu.uuid, gpu.product_name, (gpu.uuid, None), gpu.memory_bytes, 1.0)


def device_facts(inventory: Inventory) -> Mapping[str, DeviceFacts]:
    return {name: device_facts_of(origin) for name, origin in inventory.origin_of_device.items()}
