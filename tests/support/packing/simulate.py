"""Replays a request trace on one node and measures how well it packs.

Metrics, all over GPU memory (the resource every offering mode divides):
- refused: arrivals that got no device.
- fragmented: refusals although the node's free memory was at least what the claim asked
  for; what a perfect packer could have admitted at that moment.
- memory at first refusal: the fraction of the node's memory allocated when the first claim
  was refused (higher is better: the node filled up further before saying no).
- stranded: the mean fraction of the node's memory that was free at the fragmented refusals.
- utilisation: the time-weighted mean fraction of the node's memory allocated.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_driver.packing.allocator import Allocation, Claim, NodeState, Refusal
from tests.support.packing.bound import RepackingPacker
from tests.support.packing.traces import Event, Shape

# How a claim gets its devices: the scheduler's first fit (NodeState.allocate) or a stand-in.
Chooser = Callable[[NodeState, Claim], Allocation | Refusal]


def first_fit(state: NodeState, claim: Claim) -> Allocation | Refusal:
    return state.allocate(claim)


@dataclass(frozen=True, slots=True)
class TraceResult:
    arrivals: int
    refused: int
    # GPU memory the refused claims asked for, over the node's memory (refusing one whole GPU
    # weighs as much as refusing eight 10 GiB shares; the count alone favours refusing big claims).
    refused_memory: float
    fragmented: int
    memory_at_first_refusal: float | None
    stranded: float
    utilisation: float


def replay(
    state: NodeState, events: Sequence[Event], node_memory_bytes: int, choose: Chooser = first_fit
) -> TraceResult:
    """Runs the trace on `state` (which it changes) and measures it."""
    held: dict[int, Allocation] = {}

    def admit(claim_id: int, shape: Shape) -> bool:
        answer = choose(state, shape.claim)
        if isinstance(answer, Refusal):
            return False
        state.add(answer)
        held[claim_id] = answer
        return True

    def depart(claim_id: int, shape: Shape) -> None:
        state.remove(held.pop(claim_id))

    return _measure(events, node_memory_bytes, admit, depart, fragmentation=True)


def replay_repacking(packer: RepackingPacker, events: Sequence[Event], node_memory_bytes: int) -> TraceResult:
    """The trace under a packer that moves running claims at will (`bound.RepackingPacker`):
    every refusal is one of capacity, none of fragmentation."""

    def admit(claim_id: int, shape: Shape) -> bool:
        (request,) = shape.claim.requests
        return packer.admit(request)

    def depart(claim_id: int, shape: Shape) -> None:
        (request,) = shape.claim.requests
        packer.depart(request)

    return _measure(events, node_memory_bytes, admit, depart, fragmentation=False)


def _measure(
    events: Sequence[Event],
    node_memory_bytes: int,
    admit: Callable[[int, Shape], bool],
    depart: Callable[[int, Shape], None],
    *,
    fragmentation: bool,
) -> TraceResult:
    """Feeds the trace to `admit` (arrivals: whether the claim got its devices) and `depart` (the
    claims it admitted, as they leave) and measures the outcome; with `fragmentation` off, no
    refusal counts as fragmented, because the packer could have moved claims to make room."""
    held: dict[int, Shape] = {}
    allocated = arrivals = refused = refused_bytes = fragmented = 0
    first_refusal: float | None = None
    stranded_sum = 0.0
    weighted = 0.0
    first_hours = last_hours = events[0].hours if events else 0.0
    for event in events:
        weighted += allocated * (event.hours - last_hours)
        last_hours = event.hours
        if event.shape is None:
            if (leaving := held.pop(event.claim_id, None)) is not None:
                depart(event.claim_id, leaving)
                allocated -= leaving.memory_bytes
            continue
        arrivals += 1
        if admit(event.claim_id, event.shape):
            held[event.claim_id] = event.shape
            allocated += event.shape.memory_bytes
            continue
        refused += 1
        refused_bytes += event.shape.memory_bytes
        if first_refusal is None:
            first_refusal = allocated / node_memory_bytes
        free = node_memory_bytes - allocated
        if fragmentation and free >= event.shape.memory_bytes:
            fragmented += 1
            stranded_sum += free / node_memory_bytes
    span = last_hours - first_hours
    return TraceResult(
        arrivals=arrivals,
        refused=refused,
        refused_memory=refused_bytes / node_memory_bytes,
        fragmented=fragmented,
        memory_at_first_refusal=first_refusal,
        stranded=stranded_sum / fragmented if fragmented else 0.0,
        utilisation=weighted / span / node_memory_bytes if span else 0.0,
    )
