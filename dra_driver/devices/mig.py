"""MIG devices: existing instances (static MIG) and every possible placement (dynamic MIG).

Dynamic MIG follows KEP-4815 (partitionable devices): each GPU has one counter set holding its
memory slices and its totals, and each placement consumes the slices it covers. The scheduler
then can never allocate two placements that overlap, nor more engines than the GPU has, which
is exactly what NVML would refuse when the instance is created at prepare.
"""

from collections.abc import Iterator

from dra_driver.devices.gpus import parent_attributes, shared_gpu_attributes
from dra_driver.devices.model import AttributeValue, Capacity, CounterConsumption, CounterSet, Device
from dra_driver.devices.naming import counter_set_name, mig_device_name
from dra_driver.hardware.model import Gpu, MigInstance, MigProfile, Placement

# Capacity name -> counter name (counter names must be DNS labels, capacity names C identifiers).
_ENGINE_COUNTERS = {
    "copyEngines": "copy-engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg-engines",
    "ofaEngines": "ofa-engines",
}


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def _engines(profile: MigProfile) -> dict[str, int]:
    return {
        "copyEngines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpegEngines": profile.jpeg_engines,
        "ofaEngines": profile.ofa_engines,
    }


def full_profile(gpu: Gpu) -> MigProfile:
    """The profile spanning the whole GPU (7g, or 4g on A30): its engines are the GPU's totals."""
    return max(gpu.mig_profiles, key=lambda profile: (profile.compute_slices, profile.memory_bytes))


def mig_counter_set(gpu: Gpu) -> CounterSet:
    full = full_profile(gpu)
    counters = {memory_slice_counter(index): 1 for index in range(gpu.memory_slices)}
    counters["memory"] = gpu.memory_bytes
    counters["multiprocessors"] = full.multiprocessors
    counters.update({_ENGINE_COUNTERS[name]: value for name, value in _engines(full).items()})
    return CounterSet(name=counter_set_name(gpu), counters=counters)


def _placement_consumption(gpu: Gpu, profile: MigProfile, placement: Placement) -> CounterConsumption:
    counters = {memory_slice_counter(index): 1 for index in placement.memory_slices}
    counters["memory"] = profile.memory_bytes
    counters["multiprocessors"] = profile.multiprocessors
    counters.update({_ENGINE_COUNTERS[name]: value for name, value in _engines(profile).items() if value})
    return CounterConsumption(counter_set=counter_set_name(gpu), counters=counters)


def _mig_attributes(gpu: Gpu, profile: MigProfile, placement: Placement) -> dict[str, AttributeValue]:
    return {
        "type": "mig",
        "profile": profile.name,
        "profileId": profile.profile_id,
        "placementStart": placement.start,
        "placementSize": placement.size,
        **parent_attributes(gpu),
        **shared_gpu_attributes(gpu),
    }


def _mig_capacity(profile: MigProfile, multiprocessors: int) -> dict[str, Capacity]:
    capacity = {"memory": Capacity(profile.memory_bytes), "multiprocessors": Capacity(multiprocessors)}
    capacity.update({name: Capacity(value) for name, value in _engines(profile).items()})
    return capacity


def dynamic_mig_devices(gpu: Gpu, profile_names: tuple[str, ...] = ()) -> Iterator[Device]:
    """Every placement of every profile (or of the named ones), each consuming its counters."""
    for profile in gpu.mig_profiles:
        if profile_names and profile.name not in profile_names:
            continue
        for placement in profile.placements:
            yield Device(
                name=mig_device_name(gpu, profile, placement.start),
                attributes=_mig_attributes(gpu, profile, placement),
                capacity=_mig_capacity(profile, profile.multiprocessors),
                consumes_counters=(_placement_consumption(gpu, profile, placement),),
            )


def usable_static_instance(instance: MigInstance) -> bool:
    """A GPU instance without a compute instance (uuid "") cannot run anything."""
    return bool(instance.uuid) and instance.compute_slices > 0


def static_mig_device(gpu: Gpu, instance: MigInstance) -> Device:
    profile = gpu.mig_profile(instance.profile_id)
    assert profile is not None, f"instance {instance.uuid} has a profile its GPU does not list"
    attributes = _mig_attributes(gpu, profile, instance.placement)
    attributes["uuid"] = instance.uuid
    return Device(
        name=mig_device_name(gpu, profile, instance.placement.start),
        attributes=attributes,
        capacity=_mig_capacity(profile, instance.multiprocessors),
    )
