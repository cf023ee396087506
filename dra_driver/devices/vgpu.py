"""vGPU devices: fractions of a non-MIG GPU's memory and compute (HAMi-style sharing).

Two ways to publish them, because clusters differ:
- capacity mode (KEP-5075 consumable capacity): the GPU itself allows multiple allocations and
  each claim takes the `memory` and `cores` it asks for; a claim that asks for nothing takes the
  defaults, which are everything, so it gets the GPU to itself.
- partitions mode (any cluster with partitionable devices): fixed-size vGPU devices draw
  `memory` and `cores` from the GPU's counter set, and the whole-GPU device draws all of it.
"""

from collections.abc import Iterator

from dra_driver.devices import attributes as names
from dra_driver.devices.gpu_settings import Enforcement, VgpuPartitionSize
from dra_driver.devices.gpus import (
    gpu_identity_attributes,
    parent_attributes,
    shared_gpu_attributes,
    whole_gpu_capacity,
)
from dra_driver.devices.model import (
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    RequestPolicy,
    ValidRange,
)
from dra_driver.devices.naming import counter_set_name, gpu_device_name, vgpu_partition_name, vgpu_size_token
from dra_driver.devices.origins import VgpuPartition
from dra_driver.hardware.model import Gpu

ALL_CORES = 100
# One MPS server takes at most this many client CUDA contexts per GPU on Volta and later
# (NVIDIA's MPS documentation, "Limitations"); under vgpu.enforcement mps every share is a client.
MPS_CLIENTS_PER_GPU = 48
# The capacity (capacity mode) or counter (partitions mode) that says so to the scheduler: each
# share takes one client by default, and a share whose pod runs several CUDA processes may ask for
# more, so the 49th client is refused at scheduling, not at prepare. One name that is both a
# valid capacity name (a C identifier) and a valid counter name (a DNS label).
MPS_CLIENTS = "clients"


def shareable_gpu_device(gpu: Gpu, memory_step: int, enforcement: Enforcement = "mps") -> Device:
    """Capacity mode. Requests round up to `memory_step`; the largest request is the largest
    multiple of the step the GPU holds, so shares can never add up to more than the GPU has.
    Under MPS the GPU's clients are a capacity too, of which every share takes at least one."""
    allocatable = gpu.memory_bytes // memory_step * memory_step
    attributes = gpu_identity_attributes(gpu, "vgpu")
    if gpu.multiprocessors:
        # Not a capacity: on a shared device a capacity without a request policy is consumed whole.
        attributes[names.MULTIPROCESSORS] = gpu.multiprocessors
    return Device(
        name=gpu_device_name(gpu),
        type="vgpu",
        attributes=attributes,
        capacity={
            "memory": Capacity(
                gpu.memory_bytes,
                RequestPolicy(
                    default=allocatable, valid_range=ValidRange(memory_step, allocatable, memory_step)
                ),
            ),
            "cores": Capacity(
                ALL_CORES, RequestPolicy(default=ALL_CORES, valid_range=ValidRange(1, ALL_CORES, 1))
            ),
            **_client_capacity(enforcement),
        },
        allow_multiple_allocations=True,
    )


def _client_capacity(enforcement: Enforcement) -> dict[str, Capacity]:
    if enforcement != "mps":
        return {}
    policy = RequestPolicy(default=1, valid_range=ValidRange(1, MPS_CLIENTS_PER_GPU, 1))
    return {MPS_CLIENTS: Capacity(MPS_CLIENTS_PER_GPU, policy)}


def partition_cores(gpu: Gpu, size: VgpuPartitionSize) -> int:
    """Configured, or the partition's share of the GPU's memory (at least 1 %)."""
    return size.cores if size.cores is not None else max(1, ALL_CORES * size.memory_bytes // gpu.memory_bytes)


def partition_slots(gpu: Gpu, size: VgpuPartitionSize, enforcement: Enforcement) -> int:
    """How many partitions of this size the GPU holds at once; under MPS no more than one
    server takes clients (sizes together are held to it by the counter set's clients)."""
    slots = min(gpu.memory_bytes // size.memory_bytes, ALL_CORES // partition_cores(gpu, size))
    return min(slots, MPS_CLIENTS_PER_GPU) if enforcement == "mps" else slots


def vgpu_counter_set(gpu: Gpu, enforcement: Enforcement) -> CounterSet:
    clients = {MPS_CLIENTS: MPS_CLIENTS_PER_GPU} if enforcement == "mps" else {}
    return CounterSet(
        name=counter_set_name(gpu), counters={"memory": gpu.memory_bytes, "cores": ALL_CORES, **clients}
    )


def _consumes(gpu: Gpu, memory_bytes: int, cores: int, clients: int = 0) -> tuple[CounterConsumption, ...]:
    counters = {"memory": memory_bytes, "cores": cores} | ({MPS_CLIENTS: clients} if clients else {})
    return (CounterConsumption(counter_set=counter_set_name(gpu), counters=counters),)


def partitioned_whole_gpu_device(gpu: Gpu) -> Device:
    """The whole GPU, offered next to its partitions; it takes every counter, so it is allocated
    only when no partition is, and the other way round."""
    return Device(
        name=gpu_device_name(gpu),
        type="gpu",
        attributes={**gpu_identity_attributes(gpu, "gpu"), names.PARTITION_TYPE: gpu_device_name(gpu)},
        capacity=whole_gpu_capacity(gpu),
        consumes_counters=_consumes(gpu, gpu.memory_bytes, ALL_CORES),
    )


def vgpu_partition_origins(
    gpu: Gpu, sizes: tuple[VgpuPartitionSize, ...], enforcement: Enforcement
) -> Iterator[VgpuPartition]:
    for size in sizes:
        cores = partition_cores(gpu, size)
        for slot in range(partition_slots(gpu, size, enforcement)):
            yield VgpuPartition(gpu, size.memory_bytes, cores, slot)


def vgpu_partition_type(gpu: Gpu, memory_bytes: int) -> str:
    """The partition type of every slot of one size on one GPU: they cost the same counters."""
    return f"{gpu_device_name(gpu)}-vgpu-{vgpu_size_token(memory_bytes)}"


def vgpu_partition_device(origin: VgpuPartition, enforcement: Enforcement) -> Device:
    """Under MPS a partition is one of its GPU's clients too."""
    gpu = origin.gpu
    return Device(
        name=vgpu_partition_name(gpu, origin.memory_bytes, origin.slot),
        type=origin.device_type,
        attributes={
            names.TYPE: origin.device_type,
            names.PARTITION_TYPE: vgpu_partition_type(gpu, origin.memory_bytes),
            **parent_attributes(gpu),
            **shared_gpu_attributes(gpu),
        },
        capacity={"memory": Capacity(origin.memory_bytes), "cores": Capacity(origin.cores)},
        consumes_counters=_consumes(gpu, origin.memory_bytes, origin.cores, 1 if enforcement == "mps" else 0),
    )
