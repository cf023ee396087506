"""The node's inventory: every device it offers, the counter sets they draw from, and what each
device stands for. A pure function of the hardware snapshot and the node configuration."""

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import msgspec

from dra_driver.devices.gpus import whole_gpu_device
from dra_driver.devices.mig import (
    dynamic_mig_device,
    dynamic_mig_origins,
    mig_counter_set,
    static_mig_device,
    usable_static_instance,
)
from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.naming import natural_key
from dra_driver.devices.node_config import GpuPlan, NodeConfig, plan_gpus
from dra_driver.devices.order import ordered_devices
from dra_driver.devices.origins import DeviceOrigin, DynamicMig, StaticMig, VgpuShare, WholeGpu
from dra_driver.devices.vgpu import (
    partitioned_whole_gpu_device,
    shareable_gpu_device,
    vgpu_counter_set,
    vgpu_partition_device,
    vgpu_partition_origins,
)
from dra_driver.hardware.model import Gpu

# A device together with what it stands for.
Offer = tuple[Device, DeviceOrigin]


class Inventory(msgspec.Struct, frozen=True):
    """What this node offers: devices in publishing order (`devices.order`), counter sets, and
    what each device stands for."""

    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...]
    device_by_name: Mapping[str, Device]
    # The typed facts behind each device, by device name: what prepare reads (never the attributes).
    origin_of_device: Mapping[str, DeviceOrigin]
    gpu_of_device: Mapping[str, Gpu]
    plans: tuple[GpuPlan, ...]
    # Things an operator should know (instances left out, and why).
    notes: tuple[str, ...] = ()

    def dynamic_mig_name(self, gpu_uuid: str, profile_id: int, placement_start: int) -> str | None:
        """The published name of a dynamic MIG placement, for messages about its instance."""
        return next(
            (
                name
                for name, origin in self.origin_of_device.items()
                if isinstance(origin, DynamicMig)
                and origin.gpu.uuid == gpu_uuid
                and origin.profile.profile_id == profile_id
                and origin.placement.start == placement_start
            ),
            None,
        )


def _static_mig(gpu: Gpu, notes: list[str]) -> Iterator[Offer]:
    """The GPU's existing instances: in mode mig-static all of them, in mig-dynamic the foreign
    ones (devices.mig), whose slices no placement is offered on even where they are unusable."""
    compute_instances_per_gpu_instance = Counter(instance.gpu_instance_id for instance in gpu.mig_instances)
    for instance in gpu.mig_instances:
        where = f"{gpu.label} MIG GPU instance {instance.gpu_instance_id}"
        profile = gpu.mig_profile(instance.profile_id)
        if not usable_static_instance(instance):
            notes.append(f"{where} has no compute instance; not published")
        elif compute_instances_per_gpu_instance[instance.gpu_instance_id] > 1:
            notes.append(f"{where} is split into several compute instances; not published")
        elif profile is None:
            notes.append(
                f"{where} has profile id {instance.profile_id}, which the GPU does not list; not published"
            )
        else:
            origin = StaticMig(gpu, profile, instance)
            yield static_mig_device(origin), origin


def _offers_of(plan: GpuPlan, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    gpu = plan.gpu
    match plan.mode:
        case "gpu":
            return [(whole_gpu_device(gpu), WholeGpu(gpu))], []
        case "mig-static":
            if not gpu.mig_instances:
                notes.append(
                    f"{gpu.label} is in MIG mode without MIG instances, so it offers nothing; "
                    "create instances (nvidia-smi mig, mig-parted) or give it mode mig-dynamic"
                )
            return list(_static_mig(gpu, notes)), []
        case "mig-dynamic":
            origins = dynamic_mig_origins(gpu, plan.settings.mig_profiles)
            dynamic = [(dynamic_mig_device(origin), origin) for origin in origins]
            return [*_static_mig(gpu, notes), *dynamic], [mig_counter_set(gpu)]
        case "vgpu-capacity":
            step = plan.settings.memory_step
            return [(shareable_gpu_device(gpu, step, plan.settings.enforcement), VgpuShare(gpu, step))], []
        case "vgpu-partitions":
            enforcement = plan.settings.enforcement
            offers: list[Offer] = [(partitioned_whole_gpu_device(gpu), WholeGpu(gpu))]
            offers += [
                (vgpu_partition_device(origin, enforcement), origin)
                for origin in vgpu_partition_origins(gpu, plan.settings.partitions, enforcement)
            ]
            return offers, [vgpu_counter_set(gpu, enforcement)]


def build_inventory(plans: Sequence[GpuPlan]) -> Inventory:
    offers: list[Offer] = []
    counter_sets: list[CounterSet] = []
    notes: list[str] = []
    for plan in plans:
        gpu_offers, gpu_counter_sets = _offers_of(plan, notes)
        offers.extend(gpu_offers)
        counter_sets.extend(gpu_counter_sets)
    devices = [device for device, _ in offers]
    return Inventory(
        # The scheduler tries devices in this order: it is the node's packing policy.
        devices=ordered_devices(offers, {plan.gpu.uuid: plan.settings.packing for plan in plans}),
        device_by_name={device.name: device for device in devices},
        counter_sets=tuple(sorted(counter_sets, key=lambda counter_set: natural_key(counter_set.name))),
        origin_of_device={device.name: origin for device, origin in offers},
        gpu_of_device={device.name: origin.gpu for device, origin in offers},
        plans=tuple(plans),
        notes=tuple(notes),
    )


def node_inventory(gpus: Sequence[Gpu], config: NodeConfig) -> Inventory:
    """Raises NodeConfigError when the configuration does not fit the GPUs."""
    return build_inventory(plan_gpus(config, gpus))
