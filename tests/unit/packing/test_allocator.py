"""The allocator model gives the scheduler's answers.

The hand-worked cases are those of the upstream allocator's own table
(dynamic-resource-allocation `structured/internal/allocatortesting`, named in each test), with
the devices rebuilt in our model: the facts (which device each request gets) are upstream's.
"""

from collections.abc import Callable, Mapping

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.classes import selector
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import (
    AttributeValue,
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    RequestPolicy,
    Taint,
    ValidRange,
    Version,
    device_to_api,
)
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.devices.slices import PlannedSlice
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.packing.allocator import (
    Allocation,
    Claim,
    DeviceResult,
    MatchAttribute,
    NodeState,
    Pool,
    Refusal,
    Request,
    allocate,
)
from dra_driver.packing.capacity_policy import ModelCapacity, Policy, charges
from tests.support.cel import selects

DRIVER = "driver-a"


def device(
    name: str,
    *,
    attributes: Mapping[str, AttributeValue] | None = None,
    capacity: Mapping[str, Capacity] | None = None,
    draws: Mapping[str, int] | None = None,
    shared: bool = False,
    taints: tuple[Taint, ...] = (),
) -> Device:
    return Device(
        name=name,
        type="gpu",
        attributes=attributes or {},
        capacity=capacity or {},
        consumes_counters=(CounterConsumption("set-1", draws),) if draws else (),
        allow_multiple_allocations=shared,
        taints=taints,
    )


def pool(*devices: Device, counters: Mapping[str, int] | None = None) -> Pool:
    slices = [PlannedSlice(devices=devices)]
    if counters:
        slices.append(PlannedSlice(counter_sets=(CounterSet("set-1", counters),)))
    return Pool.from_slices(slices, DRIVER)


def devices_of(answer: Allocation | Refusal) -> tuple[str, ...]:
    assert isinstance(answer, Allocation), answer
    return answer.devices


# Upstream's range policy helper: default 2, min 2, step 2, max 4.
def ranged(value: int) -> Capacity:
    return Capacity(value, RequestPolicy(default=2, valid_range=ValidRange(2, 4, 2)))


def at_least(amount: int) -> Request:
    return Request("req", selector=lambda d: d.capacity["memory"].value >= amount)


def test_small_and_large_backtrack_requests() -> None:
    """The large device is listed first and the small request takes it; the large request then
    finds nothing, so the search backtracks and gives the small request the small device."""
    node = pool(
        device("device-2", capacity={"memory": Capacity(2)}),
        device("device-1", capacity={"memory": Capacity(1)}),
    )
    small = Request("req-0", selector=lambda d: d.capacity["memory"].value >= 1)
    large = Request("req-1", selector=lambda d: d.capacity["memory"].value >= 2)
    answer = allocate(node, (), Claim((small, large)))
    assert isinstance(answer, Allocation)
    assert answer.results == (DeviceResult("req-0", "device-1"), DeviceResult("req-1", "device-2"))


def test_first_fit_takes_devices_in_listed_order_and_skips_allocated_ones() -> None:
    """already-allocated-devices: an allocated device is skipped, the next one is taken."""
    node = pool(device("device-1"), device("device-2"))
    taken = Allocation((DeviceResult("req", "device-1"),))
    assert devices_of(allocate(node, (), Claim((Request("req"),)))) == ("device-1",)
    assert devices_of(allocate(node, (taken,), Claim((Request("req"),)))) == ("device-2",)
    refused = allocate(node, (taken,), Claim((Request("req", count=2),)))
    assert isinstance(refused, Refusal)
    assert "req" in refused.reason


def test_devices_of_one_request_are_taken_in_order() -> None:
    node = pool(device("device-1"), device("device-2"), device("device-3"))
    assert devices_of(allocate(node, (), Claim((Request("req", count=2),)))) == ("device-1", "device-2")


def test_with_constraint_for_request_retry() -> None:
    """A constraint on req-0 alone and one on all requests: device-1 fits the first but no
    second device shares its string, so req-0 moves on to device-2."""
    node = pool(
        device("device-1", attributes={"driverVersion": Version("1.0.0"), "stringAttribute": "a"}),
        device("device-2", attributes={"driverVersion": Version("2.0.0"), "stringAttribute": "b"}),
        device("device-3", attributes={"driverVersion": Version("3.0.0"), "stringAttribute": "b"}),
    )
    claim = Claim(
        (Request("req-0"), Request("req-1")),
        (
            MatchAttribute(f"{DRIVER}/driverVersion", ("req-0",)),
            MatchAttribute(f"{DRIVER}/stringAttribute"),
        ),
    )
    assert devices_of(allocate(node, (), claim)) == ("device-2", "device-3")


def test_match_attribute_needs_the_attribute_and_its_type() -> None:
    """with-constraint-non-existent-attribute, and an int is no match for a bool."""
    node = pool(device("device-1", attributes={"n": 1}), device("device-2", attributes={"n": True}))
    claim = Claim((Request("req", count=2),), (MatchAttribute(f"{DRIVER}/n"),))
    assert isinstance(allocate(node, (), claim), Refusal)
    missing = Claim((Request("req"),), (MatchAttribute("other.example.com/n"),))
    assert isinstance(allocate(node, (), missing), Refusal)


def test_partitionable_devices_multiple_devices() -> None:
    """device-1 (4Gi) leaves 4Gi of 8Gi: device-2 (6Gi) does not fit, device-3 (4Gi) does."""
    gib = 2**30
    node = pool(
        device("device-1", draws={"memory": 4 * gib}),
        device("device-2", draws={"memory": 6 * gib}),
        device("device-3", draws={"memory": 4 * gib}),
        counters={"memory": 8 * gib},
    )
    claim = Claim((Request("req-0"), Request("req-1")))
    assert devices_of(allocate(node, (), claim)) == ("device-1", "device-3")
    # Counters of allocated devices count too: with device-1 allocated, device-2 cannot fit.
    first = Allocation((DeviceResult("req", "device-1"),))
    assert devices_of(allocate(node, (first,), Claim((Request("req"),)))) == ("device-3",)


def test_consumable_capacity_range_policy_rounds_up_to_the_step() -> None:
    """with-range-policy-step: 3 on a policy min 2 step 2 is charged 4."""
    node = pool(device("device-1", capacity={"capacity-0": ranged(4)}, shared=True))
    answer = allocate(node, (), Claim((Request("req", capacity={"capacity-0": 3}),)))
    assert isinstance(answer, Allocation)
    assert answer.results == (DeviceResult("req", "device-1", {"capacity-0": 4}),)


def test_consumable_capacity_allocated_shares_push_to_the_next_device() -> None:
    """with-allocated-capacity-next-device: device-1 (2 of 2 used) is full; device-2 serves."""
    node = pool(
        device("device-1", capacity={"capacity-0": ranged(2)}, shared=True),
        device("device-2", capacity={"capacity-0": ranged(2)}, shared=True),
    )
    used = Allocation((DeviceResult("other", "device-1", {"capacity-0": 2}),))
    answer = allocate(node, (used,), Claim((Request("req", capacity={"capacity-0": 2}),)))
    assert isinstance(answer, Allocation)
    assert answer.results == (DeviceResult("req", "device-2", {"capacity-0": 2}),)


def test_consumable_capacity_backtracks_over_shares_of_one_device() -> None:
    """with-multi-allocatable-device-backtrack: both requests of claim 0 must share an attribute;
    device-2 holds only one share, so both go to device-1; claim 1 then gets device-2."""
    node = pool(
        device("device-2", attributes={"s": "v1"}, capacity={"capacity-0": ranged(2)}, shared=True),
        device("device-1", attributes={"s": "v2"}, capacity={"capacity-0": ranged(4)}, shared=True),
    )
    state = NodeState(node)
    claim0 = Claim(
        (Request("req-0", capacity={"capacity-0": 2}), Request("req-1", capacity={"capacity-0": 2})),
        (MatchAttribute(f"{DRIVER}/s"),),
    )
    first = state.allocate(claim0)
    assert devices_of(first) == ("device-1", "device-1")
    assert isinstance(first, Allocation)
    state.add(first)
    assert devices_of(state.allocate(Claim((Request("req-0", capacity={"capacity-0": 2}),)))) == ("device-2",)


def test_a_shared_device_draws_its_counters_once_its_first_share_is_allocated() -> None:
    """allow-multiple-allocations-with-shared-device-counter-cross-cycle: device-1 has a share,
    so its counter is drawn and device-2, which needs the same counter, does not fit."""
    node = pool(
        device("device-1", attributes={"mode": "a"}, draws={"c": 1}, shared=True),
        device("device-2", attributes={"mode": "b"}, draws={"c": 1}, shared=True),
        counters={"c": 1},
    )
    share = Allocation((DeviceResult("req", "device-1", {}),))
    mode_b = Request("req", selector=lambda d: d.attributes["mode"] == "b")
    assert isinstance(allocate(node, (share,), Claim((mode_b,))), Refusal)
    assert devices_of(allocate(node, (), Claim((mode_b,)))) == ("device-2",)
    # A second share of device-1 skips the counter check.
    mode_a = Request("req", selector=lambda d: d.attributes["mode"] == "a")
    assert devices_of(allocate(node, (share,), Claim((mode_a,)))) == ("device-1",)


def test_dedicated_device_with_capacity_request_is_a_minimum() -> None:
    """consumable-capacity-dedicated-device-with-consumable-capacity-request: a device that is
    not shared serves a capacity request it covers and is allocated whole."""
    node = pool(
        device("small", capacity={"memory": Capacity(1)}), device("big", capacity={"memory": Capacity(4)})
    )
    answer = allocate(node, (), Claim((Request("req", capacity={"memory": 2}),)))
    assert isinstance(answer, Allocation)
    assert answer.results == (DeviceResult("req", "big"),)


def test_capacity_not_published_by_the_device_never_fits() -> None:
    node = pool(device("device-1", capacity={"memory": Capacity(4)}))
    assert isinstance(allocate(node, (), Claim((Request("req", capacity={"cores": 1}),))), Refusal)


def test_untolerated_taints_block_and_effect_none_does_not() -> None:
    """tainted-two-devices / tainted-no-effect."""
    node = pool(
        device("device-1", taints=(Taint("k", "v", "NoSchedule"),)),
        device("device-2", taints=(Taint("k", "v", "None"),)),
    )
    assert devices_of(allocate(node, (), Claim((Request("req"),)))) == ("device-2",)


@pytest.mark.parametrize(
    ("requested", "policy", "charged"),
    [
        (None, Policy(default=1, valid_values=(1, 3)), 1),
        # with-valid-values-policy-round-up: 2 rounds up to 3.
        (2, Policy(default=1, valid_values=(1, 3)), 3),
        # Above the last valid value the request stays as it is and breaks the policy.
        (4, Policy(default=1, valid_values=(1, 3)), None),
        # with-request-over-max-sharing-policy.
        (6, Policy(default=2, minimum=2, maximum=4, step=2), None),
        (1, Policy(default=2, minimum=2, maximum=4, step=2), 2),
        # A range without a step keeps the request.
        (3, Policy(minimum=2, maximum=4), 3),
        (None, None, 8),
        (5, None, 5),
    ],
)
def test_charges_follow_the_request_policy(
    requested: int | None, policy: Policy | None, charged: int | None
) -> None:
    requests = {} if requested is None else {"c": requested}
    answer = charges(requests, {"c": ModelCapacity(8, policy)})
    assert (answer and answer["c"]) == charged


def test_unrequested_capacities_are_charged_their_default_or_whole() -> None:
    capacities = {"memory": ModelCapacity(8, Policy(default=8, minimum=1, step=1)), "sms": ModelCapacity(100)}
    assert charges({"memory": 2}, capacities) == {"memory": 2, "sms": 100}


def dgx_h100_mig_pool() -> Pool:
    gpus = simulated_gpus("node-a", resolve_node_spec("dgx-h100-mig"))
    inventory = node_inventory(gpus, NodeConfig(default=GpuSettings(mode="mig-dynamic")))
    return Pool.from_inventory(inventory, DRIVER)


def profile(name: str) -> Request:
    return Request(name, selector=lambda d: d.attributes.get("profile") == name)


def test_our_mig_counters_keep_placements_apart() -> None:
    """On our own dynamic-MIG pool: seven 1g.10gb fill GPU 0, the eighth goes to GPU 1, and a
    7g.80gb then skips GPU 0 and GPU 1 too."""
    state = NodeState(dgx_h100_mig_pool())
    names = []
    for _ in range(8):
        answer = state.allocate(Claim((profile("1g.10gb"),)))
        assert isinstance(answer, Allocation)
        state.add(answer)
        names.append(answer.devices[0])
    assert [name.split("-mig-")[0] for name in names] == ["gpu-0"] * 7 + ["gpu-1"]
    assert len(set(names)) == 8
    assert devices_of(state.allocate(Claim((profile("7g.80gb"),))))[0].startswith("gpu-2-")


def test_removing_an_allocation_frees_its_devices_and_counters() -> None:
    state = NodeState(dgx_h100_mig_pool())
    whole = state.allocate(Claim((profile("7g.80gb"),)))
    assert isinstance(whole, Allocation)
    state.add(whole)
    assert devices_of(state.allocate(Claim((profile("1g.10gb"),))))[0].startswith("gpu-1-")
    state.remove(whole)
    assert devices_of(state.allocate(Claim((profile("1g.10gb"),))))[0].startswith("gpu-0-")
    assert all(amount == 0 for counters in state.counters_used().values() for amount in counters.values())


def cel(expression: str) -> Callable[[Device], bool]:
    """A class's and a claim's selector evaluated by a real CEL engine on the rendered device."""
    return lambda device: selects(expression, DEFAULT_DRIVER_NAME, device_to_api(device))


def test_real_cel_selectors_and_match_attribute_on_our_mig_pool() -> None:
    """The published MIG DeviceClass selector and a claim's profile selector, in real CEL: two
    3g.40gb claims fill GPU 0 (slice 4 first: it blocks less than slice 0), the third goes to
    GPU 1; a 4g and a 1g that must share a GPU (matchAttribute parentUUID) backtrack to GPU 2."""
    gpus = simulated_gpus("node-a", resolve_node_spec("dgx-h100-mig"))
    inventory = node_inventory(gpus, NodeConfig(default=GpuSettings(mode="mig-dynamic")))
    state = NodeState(Pool.from_inventory(inventory, DEFAULT_DRIVER_NAME))
    mig = selector("mig", DEFAULT_DRIVER_NAME)

    def of_profile(name: str, profile: str) -> Request:
        attributes = f'device.attributes["{DEFAULT_DRIVER_NAME}"]'
        return Request(name, selector=cel(f'{mig} && {attributes}.profile == "{profile}"'))

    placed: list[str] = []
    for _ in range(3):
        answer = state.allocate(Claim((of_profile("mig", "3g.40gb"),)))
        assert isinstance(answer, Allocation)
        state.add(answer)
        placed += answer.devices
    assert placed == ["gpu-0-mig-3g40gb-4", "gpu-0-mig-3g40gb-0", "gpu-1-mig-3g40gb-4"]
    pair = Claim(
        (of_profile("big", "4g.40gb"), of_profile("small", "1g.10gb")),
        (MatchAttribute(f"{DEFAULT_DRIVER_NAME}/parentUUID"),),
    )
    # The 4g fits GPU 1 next to its 3g, but then the 1g has no slice left there: backtrack to GPU 2.
    # (The 1g's first placement is slice 5: slice 6 would orphan slice 7, devices.order.)
    assert devices_of(state.allocate(pair)) == ("gpu-2-mig-4g40gb-0", "gpu-2-mig-1g10gb-5")
    apart = Claim((of_profile("big", "4g.40gb"), of_profile("small", "1g.10gb")))
    assert devices_of(state.allocate(apart)) == ("gpu-1-mig-4g40gb-0", "gpu-2-mig-1g10gb-5")
