"""The node's inventory: every device it offers, the counter sets they draw from, and what each
device stands for. A pure function of the hardware snapshot and the node configuration."""

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from dra_driver.devices.gpus import whole_gpu_device
from dra_driver.devices.mig import (
    dynamic_mig_devices,
    mig_counter_set,
    static_mig_device,
    usable_static_instance,
)
from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.naming import natural_key
from dra_driver.devices.node_config import GpuPlan, NodeConfig, plan_gpus
from dra_driver.devices.vgpu import (
    partitioned_whole_gpu_device,
    shareable_gpu_device,
    vgpu_counter_set,
    vgpu_partition_devices,
)
from dra_driver.hardware.model import Gpu


@dataclass(frozen=True, slots=True)
class Inventory:
    """What this node offers: devices sorted by name, counter sets, and the GPU behind each device."""

    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...]
    device_by_name: Mapping[str, Device]
    gpu_of_device: Mapping[str, Gpu]
    plans: tuple[GpuPlan, ...]
    # Things an operator should know (instances left out, and why).
    notes: tuple[str, ...] = ()


def _static_mig(gpu: Gpu, notes: list[str]) -> Iterator[Device]:
    if not gpu.mig_instances:
        notes.append(
            f"{gpu.label} is in MIG mode without MIG instances, so it offers nothing; "
            "create instances (nvidia-smi mig, mig-parted) or give it mode mig-dynamic"
        )
    compute_instances_per_gpu_instance = Counter(instance.gpu_instance_id for instance in gpu.mig_instances)
    for instance in gpu.mig_instances:
        where = f"{gpu.label} MIG GPU instance {instance.gpu_instance_id}"
        if not usable_static_instance(instance):
            notes.append(f"{where} has no compute instance; not published")
        elif compute_instances_per_gpu_instance[instance.gpu_instance_id] > 1:
            notes.append(f"{where} is split into several compute instances; not published")
        elif gpu.mig_profile(instance.profile_id) is None:
            notes.append(
                f"{where} has profile id {instance.profile_id}, which the GPU does not list; not published"
            )
        else:
            yield static_mig_device(gpu, instance)


def _devices_of(plan: GpuPlan, notes: list[str]) -> tuple[list[Device], list[CounterSet]]:
    gpu = plan.gpu
    match plan.mode:
        case "gpu":
            return [whole_gpu_device(gpu)], []
        case "mig-static":
            return list(_static_mig(gpu, notes)), []
        case "mig-dynamic":
            return list(dynamic_mig_devices(gpu, plan.settings.mig_profiles)), [mig_counter_set(gpu)]
        case "vgpu-capacity":
            return [shareable_gpu_device(gpu, plan.settings.memory_step)], []
        case "vgpu-partitions":
            devices = [
                partitioned_whole_gpu_device(gpu),
                *vgpu_partition_devices(gpu, plan.settings.partitions),
            ]
            return devices, [vgpu_counter_set(gpu)]


def build_inventory(plans: Sequence[GpuPlan]) -> Inventory:
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    gpu_of_device: dict[str, Gpu] = {}
    notes: list[str] = []
    for plan in plans:
        gpu_devices, gpu_counter_sets = _devices_of(plan, notes)
        devices.extend(gpu_devices)
        counter_sets.extend(gpu_counter_sets)
        gpu_of_device.update((device.name, plan.gpu) for device in gpu_devices)
    return Inventory(
        devices=tuple(sorted(devices, key=lambda device: natural_key(device.name))),
        device_by_name={device.name: device for device in devices},
        counter_sets=tuple(sorted(counter_sets, key=lambda counter_set: natural_key(counter_set.name))),
        gpu_of_device=gpu_of_device,
        plans=tuple(plans),
        notes=tuple(notes),
    )


def node_inventory(gpus: Sequence[Gpu], config: NodeConfig) -> Inventory:
    """Raises NodeConfigError when the configuration does not fit the GPUs."""
    return build_inventory(plan_gpus(config, gpus))
