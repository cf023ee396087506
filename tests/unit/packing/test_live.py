"""The live-order model (issue 34): the online best fit it imitates, the layouts the slice limits
allow, and what republishing costs."""

from collections.abc import Sequence

import pytest
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig, VgpuPartitionSize
from dra_driver.devices.slices import MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS
from dra_driver.hardware.model import Gpu
from dra_driver.packing.allocator import Allocation, Claim, NodeState, Pool, Refusal
from dra_driver.packing.best_fit import GpuScorer, ObservedState, OnlineBestFit
from dra_driver.packing.live import (
    LiveMode,
    LiveOrder,
    agent_groups,
    gpu_layout,
    grouped_layout,
)
from tests.support.nodes import simulated_node
from tests.support.packing.simulate import Chooser, TraceResult, replay
from tests.support.packing.traces import GIB, Event, make_trace, mig_mix, mig_shapes

DRIVER = "gpu.example.com"


def _mig(count: int) -> tuple[tuple[Gpu, ...], Inventory]:
    gpus = tuple(simulated_node("dgx-h100-mig")[:count])
    return gpus, node_inventory(gpus, NodeConfig(default=GpuSettings(mode="mig-dynamic")))


class _Recording:
    """Wraps a chooser and keeps the devices it gave, so two choosers compare claim by claim."""

    def __init__(self, chooser: Chooser) -> None:
        self.chooser = chooser
        self.given: list[tuple[str, ...] | None] = []

    def __call__(self, state: NodeState, claim: Claim) -> Allocation | Refusal:
        answer = self.chooser(state, claim)
        self.given.append(answer.devices if isinstance(answer, Allocation) else None)
        return answer


def _run(
    inventory: Inventory, events: Sequence[Event], memory: int, make: str, **live: object
) -> tuple[TraceResult, _Recording, LiveOrder | None]:
    groups, probes = agent_groups(inventory)
    scorer = GpuScorer(inventory, DRIVER, probes)
    state = ObservedState(Pool.from_inventory(inventory, DRIVER), scorer)
    chooser: Chooser
    order = None
    if make == "best-fit":
        chooser = OnlineBestFit(scorer)
    elif make == "static":
        chooser = lambda state, claim: state.allocate(claim)  # noqa: E731
    else:
        layout = (
            grouped_layout(inventory, groups) if live.get("layout") == "grouped" else gpu_layout(inventory)
        )
        mode: LiveMode = "regenerate" if live.get("mode") == "regenerate" else "within"
        lag = live.get("lag", 0)
        assert isinstance(lag, int)
        chooser = order = LiveOrder(inventory, scorer, groups, layout, mode, lag)
    recording = _Recording(chooser)
    return replay(state, events, memory, recording), recording, order


def test_best_fit_keeps_the_largest_profiles_possible_on_an_empty_gpu() -> None:
    gpus, inventory = _mig(1)
    _, probes = agent_groups(inventory)
    assert [probe.name for probe in probes][:3] == ["7g.80gb", "4g.40gb", "3g.40gb"]
    scorer = GpuScorer(inventory, DRIVER, probes)
    state = ObservedState(Pool.from_inventory(inventory, DRIVER), scorer)
    answer = OnlineBestFit(scorer)(state, mig_shapes(gpus[0])["1g"].claim)
    assert isinstance(answer, Allocation)
    (device,) = answer.devices
    # Any 1g blocks the 7g; one in slices 4-6 leaves the 4g (slices 0-3) possible; each blocks
    # the 3g at 4, but only the one at 6 leaves the 2g at 4 possible. Largest first, so best fit
    # takes slice 6 although it orphans slice 7 (binpack's first 1g is slice 5).
    loss = scorer.loss(answer.results[0])
    assert loss[:4] == (1, 0, 1, 0)
    assert device == "gpu-0-mig-1g10gb-6"


def test_the_scorer_follows_the_state_and_scores_gpus_alike() -> None:
    gpus, inventory = _mig(2)
    _, probes = agent_groups(inventory)
    scorer = GpuScorer(inventory, DRIVER, probes)
    state = ObservedState(Pool.from_inventory(inventory, DRIVER), scorer)
    four_g = state.allocate(mig_shapes(gpus[0])["4g"].claim)
    assert isinstance(four_g, Allocation)
    state.add(four_g)
    one_g = {
        result.device: scorer.loss(result)
        for result in state.fitting(mig_shapes(gpus[0])["1g"].claim.requests[0])
    }
    on_gpu0 = [loss for device, loss in one_g.items() if device.startswith("gpu-0-")]
    on_gpu1 = [loss for device, loss in one_g.items() if device.startswith("gpu-1-")]
    # GPU 0 has no 7g or 4g left to lose; the empty GPU 1 loses its 7g to any 1g.
    assert all(loss[0] == 0 for loss in on_gpu0) and all(loss[0] == 1 for loss in on_gpu1)
    state.remove(four_g)
    again = {
        result.device: scorer.loss(result)
        for result in state.fitting(mig_shapes(gpus[0])["1g"].claim.requests[0])
    }
    assert {loss for device, loss in again.items() if device.startswith("gpu-0-")} == set(on_gpu1)


def test_grouped_layout_puts_each_profile_in_one_slice_within_the_limit() -> None:
    _, inventory = _mig(8)
    groups, _ = agent_groups(inventory)
    layout = grouped_layout(inventory, groups)
    names = [name for names in layout.slices for name in names]
    assert sorted(names) == sorted(device.name for device in inventory.devices)
    assert all(len(names) <= MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS for names in layout.slices)
    assert (len(layout.slices), layout.counter_slices) == (4, 1)
    for group in groups:
        members = {device.name for device in inventory.devices if group.selector(device)}
        assert sum(1 for names in layout.slices if members & set(names)) == 1
    # Today's plan cuts GPU after GPU every 64 devices: the 1g.10gb devices span three slices.
    today = gpu_layout(inventory)
    one_g = {device.name for device in inventory.devices if groups[0].selector(device)}
    assert sum(1 for names in today.slices if one_g & set(names)) == 3


def test_a_group_over_the_slice_limit_is_cut() -> None:
    gpus = tuple(simulated_node("dgx-h100")[:8])
    settings = GpuSettings(
        mode="vgpu-partitions", partitions=tuple(VgpuPartitionSize(s * GIB) for s in (5, 10, 20))
    )
    inventory = node_inventory(gpus, NodeConfig(default=settings))
    groups, probes = agent_groups(inventory)
    assert probes[0].name == "gpu-0"  # the whole GPU is the largest shape
    layout = grouped_layout(inventory, groups)
    assert sorted(len(names) for names in layout.slices)[-1] == MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS
    assert sum(map(len, layout.slices)) == len(inventory.devices)


def _trace(gpus: Sequence[Gpu], arrivals: int = 300) -> tuple[tuple[Event, ...], int]:
    memory = sum(gpu.memory_bytes for gpu in gpus)
    return make_trace(mig_mix(gpus[0]), memory, arrivals, seed=5, load=1.0), memory


def test_the_live_order_at_lag_0_makes_first_fit_choose_what_best_fit_chooses() -> None:
    gpus, inventory = _mig(2)
    events, memory = _trace(gpus)
    best, best_given, _ = _run(inventory, events, memory, "best-fit")
    live, live_given, order = _run(inventory, events, memory, "live", layout="grouped")
    _, static_given, _ = _run(inventory, events, memory, "static")
    assert live_given.given == best_given.given
    assert live.refused == best.refused
    assert static_given.given != best_given.given  # the live order changes what the scheduler takes
    assert order is not None
    changes = 2 * (live.arrivals - live.refused)
    assert 0 < order.count.writes < changes
    assert order.count.regenerations == order.count.incomplete_writes == 0


def test_a_lag_longer_than_the_trace_is_first_fit_over_the_order_published_at_start() -> None:
    gpus, inventory = _mig(2)
    events, memory = _trace(gpus)
    _, stale_given, order = _run(inventory, events, memory, "live", layout="grouped", lag=10_000)
    assert order is not None and order.count.writes > 0  # the agent kept republishing, unseen
    at_start = order.history[0]
    devices = tuple(sorted(inventory.devices, key=lambda device: at_start[device.name]))
    frozen = replace(inventory, devices=devices)
    _, frozen_given, _ = _run(frozen, events, memory, "static")
    _, static_given, _ = _run(inventory, events, memory, "static")
    assert stale_given.given == frozen_given.given
    # The start-up order is already best fit's for the empty node, not the static order.
    assert stale_given.given != static_given.given


@pytest.mark.parametrize("lag", [1, 5])
def test_a_lagging_order_serves_some_claims_with_an_old_order(lag: int) -> None:
    gpus, inventory = _mig(2)
    events, memory = _trace(gpus)
    _, now_given, _ = _run(inventory, events, memory, "live", layout="grouped")
    _, late_given, _ = _run(inventory, events, memory, "live", layout="grouped", lag=lag)
    assert late_given.given != now_given.given


def test_regenerating_rewrites_every_slice_and_leaves_the_pool_incomplete_meanwhile() -> None:
    gpus, inventory = _mig(2)
    events, memory = _trace(gpus)
    best, _, _ = _run(inventory, events, memory, "best-fit")
    regenerated, _, order = _run(inventory, events, memory, "live", mode="regenerate")
    assert order is not None and order.count.regenerations > 0
    slices = len(order.layout.slices) + order.layout.counter_slices
    assert order.count.writes == slices * order.count.regenerations
    assert order.count.incomplete_writes == (slices - 1) * order.count.regenerations
    assert regenerated.refused == best.refused


def test_nothing_is_written_while_the_state_stays_the_same() -> None:
    gpus, inventory = _mig(2)
    groups, probes = agent_groups(inventory)
    scorer = GpuScorer(inventory, DRIVER, probes)
    state = ObservedState(Pool.from_inventory(inventory, DRIVER), scorer)
    order = LiveOrder(inventory, scorer, groups, grouped_layout(inventory, groups))
    claim = mig_shapes(gpus[0])["1g"].claim
    for _ in range(3):
        answer = order(state, claim)
        assert isinstance(answer, Allocation)
        state.add(answer)
    written = order.count.writes
    assert written > 0  # the static order's first 1g is not best fit's
    order(state, claim)
    order(state, claim)
    assert order.count.writes == written
