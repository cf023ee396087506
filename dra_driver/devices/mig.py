"""MIG devices: existing instances (static MIG) and every possible placement (dynamic MIG).

Dynamic MIG follows KEP-4815 (partitionable devices): each GPU has one counter set holding its
memory slices and its totals, and each placement consumes the slices it covers. The scheduler
then can never allocate two placements that overlap, nor more engines than the GPU has, which
is exactly what NVML would refuse when the instance is created at prepare.

A GPU in mode mig-dynamic may have instances already that none of our claims made ("foreign":
made by hand, or mig-parted's layout left in place when the mode changed). The agent hands the
plan a GPU carrying only those (`agent.node_configs.unclaimed_mig`); the instances our claims
made stay out of it, because the claim holding one holds its placement device too. Each usable
foreign instance is offered as a static MIG device, the placements overlapping any foreign
instance are left out, and its resources are taken off the counter set's totals: NVML would
refuse the placements, or the engines, that it occupies. A placement and a static device never
share a name (both are `mig_device_name(gpu, profile, start)`): an instance at `start` covers
slice `start`, so every placement starting there overlaps it and is left out.
"""

from collections.abc import Iterator

from msgspec.structs import asdict, replace

from dra_driver.devices import attributes as names
from dra_driver.devices.gpus import parent_attributes, shared_gpu_attributes
from dra_driver.devices.model import AttributeValue, Capacity, CounterConsumption, CounterSet, Device
from dra_driver.devices.naming import counter_set_name, mig_device_name
from dra_driver.devices.origins import DynamicMig, StaticMig
from dra_driver.hardware.model import (
    Gpu,
    MigInstance,
    MigMode,
    MigProfile,
    MigResources,
    Placement,
    mig_capacity,
)

# MigResources field -> (capacity name, counter name): capacity names are C identifiers, counter
# names DNS labels. The order is the order the counters are published in.
_RESOURCE_NAMES = {
    "memory_bytes": ("memory", "memory"),
    "multiprocessors": ("multiprocessors", "multiprocessors"),
    "copy_engines": ("copyEngines", "copy-engines"),
    "decoders": ("decoders", "decoders"),
    "encoders": ("encoders", "encoders"),
    "jpeg_engines": ("jpegEngines", "jpeg-engines"),
    "ofa_engines": ("ofaEngines", "ofa-engines"),
}


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def _counters(resources: MigResources) -> dict[str, int]:
    amounts = asdict(resources)
    return {counter: amounts[field] for field, (_, counter) in _RESOURCE_NAMES.items()}


def _gpu_instances(gpu: Gpu) -> list[MigInstance]:
    """One entry per GPU instance: a GPU instance split into compute instances is listed once
    per compute instance, but takes its slices and engines once."""
    return list({instance.gpu_instance_id: instance for instance in gpu.mig_instances}.values())


def _taken_slices(gpu: Gpu) -> set[int]:
    return {index for instance in _gpu_instances(gpu) for index in instance.placement.memory_slices}


def mig_counter_set(gpu: Gpu) -> CounterSet:
    """The GPU's memory slices and the budget NVML holds all its instances to (mig_capacity), less
    what the GPU's (foreign) instances take, so the counters refuse exactly what NVML would. An
    instance of a profile the GPU does not list takes its slices only: its engines are unknown."""
    taken = _taken_slices(gpu)
    counters = {memory_slice_counter(index): int(index not in taken) for index in range(gpu.memory_slices)}
    profiles = [gpu.mig_profile(instance.profile_id) for instance in _gpu_instances(gpu)]
    used = MigResources.total(profile for profile in profiles if profile is not None)
    capacity = mig_capacity(gpu.mig_profiles, gpu.memory_bytes)
    left = MigResources(
        *(max(0, have - take) for have, take in zip(capacity.amounts(), used.amounts(), strict=True))
    )
    counters.update(_counters(left))
    return CounterSet(name=counter_set_name(gpu), counters=counters)


def _placement_consumption(gpu: Gpu, profile: MigProfile, placement: Placement) -> CounterConsumption:
    counters = {memory_slice_counter(index): 1 for index in placement.memory_slices}
    counters.update({name: value for name, value in _counters(MigResources.of(profile)).items() if value})
    return CounterConsumption(counter_set=counter_set_name(gpu), counters=counters)


def _mig_attributes(gpu: Gpu, profile: MigProfile, placement: Placement) -> dict[str, AttributeValue]:
    return {
        names.TYPE: "mig",
        names.PROFILE: profile.name,
        names.PROFILE_ID: profile.profile_id,
        names.PLACEMENT_START: placement.start,
        names.PLACEMENT_SIZE: placement.size,
        **parent_attributes(gpu),
        **shared_gpu_attributes(gpu),
    }


def _mig_capacity(profile: MigProfile, multiprocessors: int) -> dict[str, Capacity]:
    amounts = asdict(replace(MigResources.of(profile), multiprocessors=multiprocessors))
    return {capacity: Capacity(amounts[field]) for field, (capacity, _) in _RESOURCE_NAMES.items()}


def dynamic_mig_origins(gpu: Gpu, profile_names: tuple[str, ...] = ()) -> Iterator[DynamicMig]:
    """Every placement of every profile (or of the named ones) clear of the GPU's instances."""
    taken = _taken_slices(gpu)
    for profile in gpu.mig_profiles:
        if profile_names and profile.name not in profile_names:
            continue
        for placement in profile.placements:
            if taken.isdisjoint(placement.memory_slices):
                yield DynamicMig(gpu, profile, placement)


def dynamic_mig_device(origin: DynamicMig) -> Device:
    """A placement as a device that consumes its memory slices and engines from the GPU's counters."""
    gpu, profile, placement = origin.gpu, origin.profile, origin.placement
    return Device(
        name=mig_device_name(gpu, profile, placement.start),
        type=origin.device_type,
        attributes=_mig_attributes(gpu, profile, placement),
        capacity=_mig_capacity(profile, profile.multiprocessors),
        consumes_counters=(_placement_consumption(gpu, profile, placement),),
    )


def has_instances(gpu: Gpu) -> bool:
    """A GPU in MIG mode with instances: the agent offers only its instances (mode auto or
    mig-static), so a plan never offers it whole or shared unless the operator destroys them."""
    return gpu.mig_mode is MigMode.ENABLED and bool(gpu.mig_instances)


def usable_static_instance(instance: MigInstance) -> bool:
    """A GPU instance without a compute instance (uuid "") cannot run anything."""
    return bool(instance.uuid) and instance.compute_slices > 0


def static_mig_device(origin: StaticMig) -> Device:
    gpu, profile, instance = origin.gpu, origin.profile, origin.instance
    attributes = _mig_attributes(gpu, profile, instance.placement)
    attributes[names.UUID] = instance.uuid
    return Device(
        name=mig_device_name(gpu, profile, instance.placement.start),
        type=origin.device_type,
        attributes=attributes,
        capacity=_mig_capacity(profile, instance.multiprocessors),
    )
