"""`dra-driver plan --trace`: a trace of pods arriving and leaving, replayed on one node's
published devices twice, with the static order the agent publishes and with the live order of
`packing.live` (the agent's order recomputed from the state before each arrival, lag 0), so the
two can be compared side by side.

The GPUs are drawn as they stand at one moment, the same for both orders: when the static order
first refuses a pod (where packing starts to matter), or after the last arrival when it refuses
none.
"""

from collections.abc import Callable, Mapping, Sequence

import msgspec

from dra_driver.devices.inventory import Inventory
from dra_driver.packing.allocator import Allocation, Claim, NodeState, Pool, Refusal
from dra_driver.packing.best_fit import GpuScorer, ObservedState
from dra_driver.packing.layout import Occupant, gpu_layouts
from dra_driver.packing.live import LiveOrder, agent_groups, grouped_layout
from dra_driver.packing.planner import (
    GpuOutcome,
    GroupOutcome,
    ModePlan,
    PlacedPod,
    PlanMode,
    gpu_outcome,
    placed_pod,
    shape_claims,
)
from dra_driver.packing.shapes import PodGroup, PodShape
from dra_driver.packing.trace_file import Trace, TraceError

Chooser = Callable[[NodeState, Claim], Allocation | Refusal]


class OrderReplay(msgspec.Struct, frozen=True):
    """One order's replay: `plan` counts every arrival (placed = admitted at some point) and draws
    the GPUs at the chosen moment."""

    plan: ModePlan
    refused: int
    first_refusal_seconds: float | None
    # Live order only: slice writes the agent would make, and allocation changes they followed.
    slice_writes: int
    changes: int


def trace_groups(trace: Trace) -> tuple[PodGroup, ...]:
    """One group per pod shape, in the order of first arrival, counting its arrivals."""
    counts: dict[PodShape, int] = {}
    first: dict[PodShape, int] = {}
    for event in trace.events:
        if event.shape is not None:
            counts[event.shape] = counts.get(event.shape, 0) + 1
            first.setdefault(event.shape, event.pod)
    return tuple(
        PodGroup(counts[shape], shape, first[shape]) for shape in sorted(counts, key=first.__getitem__)
    )


def check_trace_profiles(trace: Trace, source: str, offered: Sequence[str]) -> None:
    """TraceError naming the first arrival that asks for a MIG profile the node does not offer."""
    for event in trace.events:
        shape = event.shape
        if shape is not None and shape.kind == "mig" and shape.profile not in offered:
            they = f"they offer {', '.join(offered)}" if offered else "none of them supports MIG"
            raise TraceError(
                f'{source}: arrivals[{event.pod}].pod: MIG profile "{shape.profile}" is not offered '
                f"by this node's GPUs; {they}"
            )


def _moment(trace: Trace, pool: Pool, claims: Mapping[PodShape, Claim]) -> int:
    """The event index to draw at: the static order's first refusal, else the last arrival."""
    state = NodeState(pool)
    held: dict[int, Allocation] = {}
    last = 0
    for number, event in enumerate(trace.events):
        if event.shape is None:
            if (allocation := held.pop(event.pod, None)) is not None:
                state.remove(allocation)
            continue
        last = number
        answer = state.allocate(claims[event.shape])
        if isinstance(answer, Refusal):
            return number
        state.add(answer)
        held[event.pod] = answer
    return last


def _replay(
    order: str,
    mode: PlanMode,
    trace: Trace,
    pool: Pool,
    state: NodeState,
    choose: Chooser,
    moment: int,
    notes: tuple[str, ...],
) -> OrderReplay:
    groups = trace_groups(trace)
    claims = shape_claims(groups)
    devices = {device.name: device for device in pool.devices}
    gpu_index = {layout.uuid: layout.index for layout in gpu_layouts(pool, ())}
    held: dict[int, tuple[Allocation, tuple[Occupant, ...]]] = {}
    placed: dict[PodShape, list[PlacedPod]] = {group.shape: [] for group in groups}
    reasons: dict[PodShape, str] = {}
    refused = changes = 0
    first_refusal: float | None = None
    drawn: tuple[GpuOutcome, ...] = ()
    for number, event in enumerate(trace.events):
        if event.shape is None:
            if (leaving := held.pop(event.pod, None)) is not None:
                state.remove(leaving[0])
                changes += 1
        else:
            answer = choose(state, claims[event.shape])
            if isinstance(answer, Refusal):
                refused += 1
                reasons.setdefault(event.shape, answer.reason)
                first_refusal = event.seconds if first_refusal is None else first_refusal
            else:
                state.add(answer)
                changes += 1
                pod, occupants = placed_pod(event.pod, event.shape.text, answer, devices, gpu_index)
                held[event.pod] = (answer, occupants)
                placed[event.shape].append(pod)
        if number == moment:
            layouts = gpu_layouts(
                pool, [occupant for _, occupants in held.values() for occupant in occupants]
            )
            drawn = tuple(gpu_outcome(state, layout, groups) for layout in layouts)
    outcomes = tuple(
        GroupOutcome(group, tuple(placed[group.shape]), reasons.get(group.shape, "")) for group in groups
    )
    plan = ModePlan(mode, outcomes, drawn, notes, order)
    return OrderReplay(plan, refused, first_refusal, 0, changes)


def replay_trace(
    inventory: Inventory, driver: str, trace: Trace, mode: PlanMode, notes: tuple[str, ...] = ()
) -> tuple[OrderReplay, OrderReplay]:
    """The trace on this inventory with the static order and with the live order."""
    pool = Pool.from_inventory(inventory, driver)
    moment = _moment(trace, pool, shape_claims(trace_groups(trace)))
    static = _replay("static", mode, trace, pool, NodeState(pool), NodeState.allocate, moment, notes)
    agent, probes = agent_groups(inventory)
    scorer = GpuScorer(inventory, driver, probes)
    live_order = LiveOrder(inventory, scorer, agent, grouped_layout(inventory, agent))
    live = _replay("live", mode, trace, pool, ObservedState(pool, scorer), live_order, moment, notes)
    return static, OrderReplay(
        live.plan, live.refused, live.first_refusal_seconds, live_order.count.writes, live.changes
    )
