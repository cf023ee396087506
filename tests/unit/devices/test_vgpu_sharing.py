"""vGPU sharing can never promise more of a GPU than it has, in either mode.

Capacity mode is checked against a model of how the scheduler consumes capacity (KEP-5075:
no request takes the default, a request is rounded up onto the policy's range, and the sum
over allocations stays within the capacity's value); partitions mode against the counters.
"""

import math
from collections import Counter
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import Capacity, Device
from dra_driver.devices.node_config import GpuSettings, NodeConfig, VgpuPartitionSize
from tests.support.nodes import GIB, simulated_node

MIB = 2**20
NON_MIG_PROFILES = ["l4x8", "t4x4", "dgx-h100", "b200x8", "a30x4"]


def consumed(capacity: Capacity, request: int | None) -> int | None:
    """What one allocation takes, as the scheduler computes it; None = the device cannot serve it."""
    policy = capacity.request_policy
    assert policy is not None
    if request is None:
        return policy.default
    allowed = policy.valid_range
    value = max(request, allowed.minimum)
    value = allowed.minimum + math.ceil((value - allowed.minimum) / allowed.step) * allowed.step
    return None if value > allowed.maximum else value


def allocate(device: Device, requests: Sequence[tuple[int | None, int | None]]) -> list[tuple[int, int]]:
    """Admits requests in order while the sums fit; returns what each admitted one consumed."""
    admitted: list[tuple[int, int]] = []
    for memory_request, cores_request in requests:
        memory = consumed(device.capacity["memory"], memory_request)
        cores = consumed(device.capacity["cores"], cores_request)
        if memory is None or cores is None:
            continue
        if sum(m for m, _ in admitted) + memory > device.capacity["memory"].value:
            continue
        if sum(c for _, c in admitted) + cores > device.capacity["cores"].value:
            continue
        admitted.append((memory, cores))
    return admitted


requests = st.lists(
    st.tuples(
        st.none() | st.integers(min_value=0, max_value=200 * GIB),
        st.none() | st.integers(min_value=0, max_value=120),
    ),
    max_size=40,
)


@given(
    profile=st.sampled_from(NON_MIG_PROFILES),
    step=st.sampled_from([MIB, 256 * MIB, GIB, 3 * GIB]),
    wanted=requests,
)
def test_capacity_mode_never_overcommits_memory_or_cores(
    profile: str, step: int, wanted: list[tuple[int | None, int | None]]
) -> None:
    gpu = simulated_node(profile)[0]
    (device,) = node_inventory(
        (gpu,), NodeConfig(default=GpuSettings(mode="vgpu-capacity", memory_step=step))
    ).devices
    admitted = allocate(device, wanted)

    assert sum(memory for memory, _ in admitted) <= gpu.memory_bytes
    assert sum(cores for _, cores in admitted) <= 100
    assert all(memory % step == 0 and 1 <= cores <= 100 for memory, cores in admitted)


@given(profile=st.sampled_from(NON_MIG_PROFILES), wanted=requests)
def test_a_claim_without_capacity_requests_gets_the_gpu_to_itself(
    profile: str, wanted: list[tuple[int | None, int | None]]
) -> None:
    gpu = simulated_node(profile)[0]
    (device,) = node_inventory((gpu,), NodeConfig(default=GpuSettings(mode="vgpu-capacity"))).devices

    assert allocate(device, [(None, None), *wanted]) == [(gpu.memory_bytes, 100)]
    shares = [(memory, cores) for memory, cores in wanted if memory is not None and cores is not None]
    admitted_shares = allocate(device, shares)
    if admitted_shares:
        assert allocate(device, [*shares, (None, None)]) == admitted_shares


@given(
    profile=st.sampled_from(NON_MIG_PROFILES),
    memory_request=st.integers(min_value=1, max_value=200 * GIB),
    cores_request=st.integers(min_value=1, max_value=100),
)
def test_a_share_gets_at_least_what_it_asked_for(
    profile: str, memory_request: int, cores_request: int
) -> None:
    gpu = simulated_node(profile)[0]
    (device,) = node_inventory(
        (gpu,), NodeConfig(default=GpuSettings(mode="vgpu-capacity", memory_step=GIB))
    ).devices
    admitted = allocate(device, [(memory_request, cores_request)])
    if memory_request <= gpu.memory_bytes // GIB * GIB:
        ((memory, cores),) = admitted
        assert memory_request <= memory < memory_request + GIB and cores == cores_request
    else:
        assert admitted == []


def counters_admit(devices: list[Device], totals: dict[str, int]) -> bool:
    used: Counter[str] = Counter()
    for device in devices:
        for consumption in device.consumes_counters:
            used.update(consumption.counters)
    return all(used[name] <= totals[name] for name in used)


@given(
    profile=st.sampled_from(NON_MIG_PROFILES),
    sizes_gib=st.lists(st.integers(min_value=1, max_value=48), min_size=1, max_size=3, unique=True),
    picks=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_partitions_admitted_by_the_counters_fit_the_gpu(
    profile: str, sizes_gib: list[int], picks: list[int]
) -> None:
    gpu = simulated_node(profile)[0]
    sizes = tuple(VgpuPartitionSize(size * GIB) for size in sizes_gib if size * GIB <= gpu.memory_bytes)
    if not sizes:
        return
    inventory = node_inventory(
        (gpu,), NodeConfig(default=GpuSettings(mode="vgpu-partitions", partitions=sizes))
    )
    chosen = list({inventory.devices[pick % len(inventory.devices)].name: None for pick in picks})
    devices = [inventory.device_by_name[name] for name in chosen]
    (counter_set,) = inventory.counter_sets

    if counters_admit(devices, dict(counter_set.counters)):
        assert sum(device.capacity["memory"].value for device in devices) <= gpu.memory_bytes
        if "gpu-0" in chosen:
            assert chosen == ["gpu-0"]
