"""A live device order (issue 34), modelled: the agent republishes its device order from the
node's state so that the scheduler's first fit takes what an online best fit would. A model,
not an agent feature (docs/benchmarks.md "Live order" says why the agent keeps the static
order); it is in the wheel because `dra-driver plan --trace` replays traces with it.

What an online best fit would take is `best_fit.py`'s: the reference (`OnlineBestFit`), and the
per-GPU scorer (`GpuScorer`) the live order ranks fitting devices by.

What the API imposes, and how the model follows it (`LiveOrder`):
- The scheduler tries slices in name order and devices in listed order; the first fitting device
  wins. So the agent need not publish a full best-fit ranking: per group of interchangeable
  devices (a MIG profile, a partition size), the first fitting device of the group must be the
  best-fit one. The agent rewrites a slice only when that is not so now (coalesced: one
  recompute per arrival, covering every change since the last; nothing written while the
  answer stays the same).
- A device keeps its slice unless the pool is rewritten under a new generation; until every
  slice of the new generation is written the pool is incomplete and the scheduler skips it.
  Mode "within": devices never move, the agent reorders inside a slice and updates only that
  slice under the same generation (each slice stays self-consistent, so a reader mixing old and
  new slices still sees every device once: the pool is never incomplete). It can then only
  choose among the fitting devices of the first slice that has any. Mode "regenerate": the
  whole pool is re-cut in best-fit order under a new generation whenever a group's answer is
  wrong: every slice (counter slices included) is written, and the pool is incomplete for all
  writes but the last.
- Per-slice limits (`devices.slices`): 64 devices once any consumes counters, else 128. The
  "grouped" layout packs each group whole into one slice where it fits, so "within" can reach
  every device of the group; "gpu" is today's plan (GPU after GPU, cut every 64 devices).
- The window between an allocation change and the new order: the scheduler may allocate with an
  older order. `lag` = k: arrival i is served with the order published at arrival i - k (before
  the first k arrivals: the order published at the agent's start, from the state the first
  arrival finds, in writes the start makes anyway and not counted). A stale order never
  allocates a device that does not fit (the scheduler checks the claims it knows); it only
  picks a worse one.
"""

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device
from dra_driver.devices.slices import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS,
    plan_slices,
)
from dra_driver.packing.allocator import (
    Allocation,
    Claim,
    DeviceResult,
    NodeState,
    Refusal,
    Request,
    Selector,
)
from dra_driver.packing.best_fit import GpuScorer, only_request

LiveMode = Literal["within", "regenerate"]


class Layout(msgspec.Struct, frozen=True):
    """Which devices sit in which device slice (in slice-name order), and how many slices carry
    only counter sets (rewritten too when the pool gets a new generation)."""

    slices: tuple[tuple[str, ...], ...]
    counter_slices: int


def _limit(devices: Iterable[Device]) -> int:
    small = any(device.consumes_counters or device.taints for device in devices)
    return MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS if small else MAX_DEVICES_PER_SLICE


def gpu_layout(inventory: Inventory) -> Layout:
    """Today's slice plan: the static order cut into slices of at most the limit."""
    planned = plan_slices(inventory, "1.35")
    return Layout(
        slices=tuple(tuple(d.name for d in s.devices) for s in planned if s.devices),
        counter_slices=sum(1 for s in planned if not s.devices),
    )


def group_of(device: Device, groups: Sequence[Request]) -> int | None:
    return next((number for number, group in enumerate(groups) if group.selector(device)), None)


def grouped_layout(inventory: Inventory, groups: Sequence[Request]) -> Layout:
    """Each group's devices (static order) in one slice where the limit allows: groups are put,
    biggest first, into the first slice with room (a group over the limit is cut into full
    slices first). Devices in no group go last. The static order per group is unchanged."""
    limit = _limit(inventory.devices)
    members: list[list[str]] = [[] for _ in groups]
    loose: list[str] = []
    for device in inventory.devices:
        number = group_of(device, groups)
        (loose if number is None else members[number]).append(device.name)
    pieces = [member[start : start + limit] for member in members for start in range(0, len(member), limit)]
    pieces += [loose[start : start + limit] for start in range(0, len(loose), limit)]
    slices: list[list[str]] = []
    for piece in sorted((p for p in pieces if p), key=len, reverse=True):
        room = next((s for s in slices if len(s) + len(piece) <= limit), None)
        if room is None:
            slices.append(list(piece))
        else:
            room.extend(piece)
    planned = plan_slices(inventory, "1.35")
    return Layout(
        slices=tuple(tuple(s) for s in slices),
        counter_slices=sum(1 for s in planned if not s.devices),
    )


class PublishCount(msgspec.Struct):
    """What publishing the live order cost."""

    publishes: int = 0  # recomputes that wrote something
    writes: int = 0  # slice writes (updates)
    regenerations: int = 0  # new pool generations
    incomplete_writes: int = 0  # writes after which the pool was still incomplete


class LiveOrder:
    """First fit over an order the agent republishes from the state: a chooser for `replay`
    (on an `ObservedState` sharing `scorer`). `groups`: one request per group of
    interchangeable devices, which is what the agent knows about claims (profiles, sizes)."""

    def __init__(
        self,
        inventory: Inventory,
        scorer: GpuScorer,
        groups: Sequence[Request],
        layout: Layout,
        mode: LiveMode = "within",
        lag: int = 0,
    ) -> None:
        self.scorer = scorer
        self.groups = tuple(groups)
        self.layout = layout
        self.mode: LiveMode = mode
        self.static = {device.name: index for index, device in enumerate(inventory.devices)}
        self.group = {device.name: group_of(device, self.groups) for device in inventory.devices}
        self.published = [list(names) for names in layout.slices]
        self.count = PublishCount()
        self.lag = lag
        self.history: deque[Mapping[str, int]] = deque(maxlen=lag + 1)

    def _positions(self) -> dict[str, int]:
        return {name: at for at, name in enumerate(name for names in self.published for name in names)}

    def _rank(self, name: str, fitting: Mapping[str, DeviceResult]) -> tuple[object, ...]:
        group = self.group[name]
        result = fitting.get(name)
        score: tuple[object, ...] = (0, self.scorer.loss(result)) if result is not None else (1, ())
        return (math.inf if group is None else group, *score, self.static[name])

    def _publish(self, state: NodeState) -> None:
        """One coalesced recompute: rewrite what makes some group's first fit wrong now."""
        fitting: dict[str, DeviceResult] = {}
        positions = self._positions()
        slice_of = {name: number for number, names in enumerate(self.published) for name in names}
        dirty: set[int] = set()
        wrong = False
        for group in self.groups:
            options = {result.device: result for result in state.fitting(group)}
            if not options:
                continue
            fitting.update(options)
            first = min(options, key=positions.__getitem__)
            reachable = (
                options
                if self.mode == "regenerate"
                else {n: r for n, r in options.items() if slice_of[n] == slice_of[first]}
            )
            best = min(reachable, key=lambda n: (self.scorer.loss(reachable[n]), self.static[n]))
            if best != first:
                dirty.add(slice_of[first])
                wrong = True
        if self.mode == "regenerate" and wrong:
            ranked = sorted(positions, key=lambda n: self._rank(n, fitting))
            sizes = [len(names) for names in self.published]
            cut, start = [], 0
            for size in sizes:
                cut.append(ranked[start : start + size])
                start += size
            self.published = cut
            writes = len(sizes) + self.layout.counter_slices
            self.count.writes += writes
            self.count.regenerations += 1
            self.count.incomplete_writes += writes - 1
            self.count.publishes += 1
        elif self.mode == "within" and dirty:
            for number in dirty:
                self.published[number].sort(key=lambda n: self._rank(n, fitting))
            self.count.writes += len(dirty)
            self.count.publishes += 1

    def __call__(self, state: NodeState, claim: Claim) -> Allocation | Refusal:
        if not self.history:
            # The agent's start: it publishes the live order for the node as it finds it, in the
            # slice writes every start makes anyway, and the scheduler has seen nothing else.
            counted = self.count
            self.count = PublishCount()
            self._publish(state)
            self.count = counted
            self.history.extend([self._positions()] * self.lag)
        else:
            self._publish(state)
        self.history.append(self._positions())
        seen = self.history[0]
        request = only_request(claim)
        # First fit in the order seen; several devices only for whole GPUs (gpu:8): no shared counters.
        options = sorted(state.fitting(request), key=lambda r: seen[r.device])[: request.count]
        if len(options) < request.count:
            short = (
                f"{len(options)} free devices fit, {request.count} needed" if options else "no device fits"
            )
            return Refusal(f"request {request.name}: {short}")
        return Allocation(tuple(options))


GIB = 2**30


class AttributeIs(msgspec.Struct, frozen=True):
    """A selector as a hashable value, so equal requests share the allocator's candidate cache
    (the benchmark traces' requests use it too)."""

    attribute: str
    value: str

    def __call__(self, device: Device) -> bool:
        return device.attributes.get(self.attribute) == self.value


class _PartitionOf(msgspec.Struct, frozen=True):
    memory_bytes: int

    def __call__(self, device: Device) -> bool:
        return (
            device.type == "vgpu"
            and not device.allow_multiple_allocations
            and _memory(device) == self.memory_bytes
        )


def _memory(device: Device) -> int:
    memory = device.capacity.get("memory")
    return memory.value if memory is not None else 0


def agent_groups(inventory: Inventory) -> tuple[tuple[Request, ...], tuple[Request, ...]]:
    """(groups, probes) as the agent can know them from its own inventory: a group per MIG
    profile, per partition size and for whole GPUs; the probes are the same shapes largest
    first. A shared device (vGPU capacity) serves any share size, which the agent cannot know
    in advance: one group (scored as a share of the smallest probe), probed with the whole GPU
    and 20, 10 and 5 GiB shares (cores in proportion)."""
    shapes: dict[tuple[object, ...], tuple[Request, int, int]] = {}
    shared: list[Device] = []
    for device in inventory.devices:
        if device.allow_multiple_allocations:
            shared.append(device)
            continue
        profile = device.attributes.get("profile")
        selector: Selector
        if isinstance(profile, str):
            selector = AttributeIs("profile", profile)
        elif device.type == "gpu":
            selector = AttributeIs("type", "gpu")
        else:
            selector = _PartitionOf(_memory(device))
        compute = device.capacity.get("multiprocessors")
        size = (_memory(device), compute.value if compute is not None else 0)
        shapes.setdefault((selector,), (Request(str(profile or device.name), selector), *size))
    groups = tuple(request for request, _, _ in shapes.values())
    probes = tuple(
        request for request, _, _ in sorted(shapes.values(), key=lambda s: (-s[1], -s[2], s[0].name))
    )
    if shared:
        total = max(_memory(device) for device in shared)
        vgpu = AttributeIs("type", shared[0].type)
        shares = [
            Request(
                f"{gib}Gi", vgpu, capacity={"memory": gib * GIB, "cores": math.ceil(100 * gib * GIB / total)}
            )
            for gib in SHARE_PROBES_GIB
        ]
        groups += (shares[-1],)
        probes += (Request("whole", vgpu), *shares)
    return groups, probes


SHARE_PROBES_GIB = (20, 10, 5)
