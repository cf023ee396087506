"""A model of the scheduler's structured allocator over one node's pool: first fit, no scoring.

The scheduler decides which of our devices a claim gets, and it does no scoring: it takes the
first solution its depth-first search finds. So the order we publish devices in is the only
packing lever there is, and planning (benchmarks, `dra-driver plan`) needs the same search.
The facts, from kubernetes/dynamic-resource-allocation `structured/internal/experimental`
(allocator_experimental.go, pools_experimental.go, consumable_capacity.go, read Nov 2026):

- Order: pools sorted by driver name, then pool name (pools whose devices have binding
  conditions last); within a pool, slices sorted by object name; within a slice, devices in
  the order listed. Our slices are named with a hex plan index first (`devices.slices`), so the
  order is the plan's: the inventory's device order. (The sorting is v0.36 / Kubernetes 1.36,
  in the allocators used whenever a non-GA DRA feature is on; before, and in the stable one,
  slices come in listing order and only the order within a slice holds.)
- Claims, then their requests, then the devices of a request, are filled in turn. Each request
  searches from the first device; the second and later device of the same request search from
  just after the previous one, so one request never gets a device twice. When a later step finds
  nothing the search backtracks: the previous step moves on to its next device.
- A device fits when: it is not in use (allocated before, or taken earlier in this search;
  devices with `allowMultipleAllocations` are never "in use"); the class and request
  selectors match; the capacity requests fit (`capacity_policy`); its counters fit; its
  NoSchedule/NoExecute taints are tolerated (the model's claims tolerate none); and every
  `matchAttribute` constraint that covers the request holds.
- Counters: a device that consumes counters fits when no counter of the pool would go below 0.
  Counters are charged per device, not per share: a shared device draws its counters when its
  first share is allocated, and later shares skip the check.
- Shared devices: every share is charged what `capacity_policy.charges` says for every capacity
  of the device, and the shares' sum must stay within each capacity's value.
- matchAttribute: the attribute is looked up by its fully qualified name, or by its bare name
  when the domain is the driver's; a device without it fails the constraint; the first device
  fixes the value and the others must equal it (same type and value).

Left out, because our claims and devices never use them: allocationMode All, firstAvailable
subrequests, adminAccess, tolerations, distinctAttribute, list-type attributes, binding
conditions, and the per-claim limit of 32 results.
"""

from collections.abc import Callable, Iterable, Mapping

import msgspec

from dra_driver.devices.model import AttributeValue, Device
from dra_driver.packing.allocator_values import (
    Allocation,
    Claim,
    DeviceResult,
    MatchAttribute,
    Pool,
    Refusal,
    Request,
    Selector,
)
from dra_driver.packing.capacity_policy import ModelCapacity, charges, model_capacity

# The values the model speaks in (allocator_values.py), where most callers import them from.
__all__ = ["Allocation", "Claim", "DeviceResult", "MatchAttribute", "Pool", "Refusal", "Request", "Selector"]


class _Entry(msgspec.Struct, frozen=True):
    """A device with what the search needs precomputed."""

    device: Device
    shared: bool
    # (counter set, counter, amount) for every counter the device draws.
    draws: tuple[tuple[str, str, int], ...]
    capacities: Mapping[str, ModelCapacity]
    untolerated_taint: bool


def _entry(device: Device) -> _Entry:
    return _Entry(
        device=device,
        shared=device.allow_multiple_allocations,
        draws=tuple(
            (consumption.counter_set, counter, amount)
            for consumption in device.consumes_counters
            for counter, amount in consumption.counters.items()
        ),
        capacities={name: model_capacity(capacity) for name, capacity in device.capacity.items()},
        untolerated_taint=any(taint.effect in ("NoSchedule", "NoExecute") for taint in device.taints),
    )


def _attribute(device: Device, qualified: str, driver: str) -> AttributeValue | None:
    if qualified in device.attributes:
        return device.attributes[qualified]
    domain, _, bare = qualified.rpartition("/")
    return device.attributes.get(bare) if domain == driver else None


def _same(first: AttributeValue, other: AttributeValue) -> bool:
    """Equal in type and value (True is no match for 1, as in the API)."""
    return type(first) is type(other) and first == other


class _Candidates(msgspec.Struct):
    """The pool's devices a request may get, in pool order, and what each share would be charged."""

    indices: tuple[int, ...]
    charged: Mapping[int, Mapping[str, int]]


class NodeState:
    """The pool with what is allocated from it: the allocator's view of one node.

    Pure (no I/O) but mutable, so a trace of thousands of claims updates it in place instead of
    rebuilding it per claim. `allocate` never changes the state; `add` and `remove` do.
    """

    def __init__(self, pool: Pool, allocations: Iterable[Allocation] = ()) -> None:
        self.pool = pool
        self._entries = tuple(_entry(device) for device in pool.devices)
        self._index = {device.name: index for index, device in enumerate(pool.devices)}
        self._in_use: set[int] = set()
        self._shares = [0] * len(self._entries)
        self._aggregated: list[dict[str, int]] = [{} for _ in self._entries]
        self._used = {name: dict.fromkeys(counters, 0) for name, counters in pool.counter_sets.items()}
        self._overdrawn: set[tuple[str, str]] = set()
        self._candidates: dict[tuple[Selector, frozenset[tuple[str, int]]], _Candidates] = {}
        for allocation in allocations:
            self.add(allocation)

    def index_of(self, device_name: str) -> int:
        return self._index[device_name]

    def in_use(self, device_name: str) -> bool:
        index = self._index[device_name]
        return index in self._in_use or self._shares[index] > 0

    def consumed(self, device_name: str) -> Mapping[str, int]:
        """What the shares of a shared device consume together."""
        return self._aggregated[self._index[device_name]]

    def counters_used(self) -> Mapping[str, Mapping[str, int]]:
        return self._used

    def _charge_counters(self, entry: _Entry, sign: int) -> None:
        for counter_set, counter, amount in entry.draws:
            used = self._used.setdefault(counter_set, {})
            used[counter] = used.get(counter, 0) + sign * amount
            total = self.pool.counter_sets.get(counter_set, {}).get(counter, 0)
            if used[counter] > total:
                self._overdrawn.add((counter_set, counter))
            else:
                self._overdrawn.discard((counter_set, counter))

    def add(self, allocation: Allocation) -> None:
        """Records an allocation (the model's own, or one read from a claim's status)."""
        for result in allocation.results:
            index = self._index[result.device]
            entry = self._entries[index]
            if entry.shared:
                if self._shares[index] == 0:
                    self._charge_counters(entry, 1)
                self._shares[index] += 1
                aggregated = self._aggregated[index]
                for name, amount in result.consumed.items():
                    aggregated[name] = aggregated.get(name, 0) + amount
            else:
                self._in_use.add(index)
                self._charge_counters(entry, 1)

    def remove(self, allocation: Allocation) -> None:
        """Frees what `add` recorded for this allocation (the claim was deallocated)."""
        for result in allocation.results:
            index = self._index[result.device]
            entry = self._entries[index]
            if entry.shared:
                self._shares[index] -= 1
                aggregated = self._aggregated[index]
                for name, amount in result.consumed.items():
                    aggregated[name] -= amount
                if self._shares[index] == 0:
                    self._charge_counters(entry, -1)
                    aggregated.clear()
            else:
                self._in_use.discard(index)
                self._charge_counters(entry, -1)

    def _candidates_for(self, request: Request) -> _Candidates:
        key = (request.selector, frozenset(request.capacity.items()))
        if (known := self._candidates.get(key)) is not None:
            return known
        indices = []
        charged: dict[int, Mapping[str, int]] = {}
        for index, entry in enumerate(self._entries):
            if entry.untolerated_taint or not request.selector(entry.device):
                continue
            amounts = charges(request.capacity, entry.capacities)
            if amounts is None:
                continue
            if not entry.shared and any(
                amount > entry.capacities[name].value for name, amount in amounts.items()
            ):
                continue
            indices.append(index)
            charged[index] = amounts
        candidates = _Candidates(tuple(indices), charged)
        self._candidates[key] = candidates
        return candidates

    def allocate(self, claim: Claim) -> Allocation | Refusal:
        """The allocation the scheduler would make for this claim now, or why there is none."""
        return _Search(self, claim).run()

    def fitting(self, request: Request) -> tuple[DeviceResult, ...]:
        """Every device that could serve a one-device request now, in pool order: the choices a
        scoring allocator would weigh (the packing bound uses it; the scheduler takes the first)."""
        search = _Search(self, Claim((request,)))
        candidates = search.candidates[0]
        found = []
        for index in candidates.indices:
            undo = search._take(index, request, candidates.charged[index])
            if undo is not None:
                found.append(search.results[-1])
                undo()
        return tuple(found)


class _Search:
    """One claim's depth-first search, with the tentative state it keeps while backtracking."""

    def __init__(self, state: NodeState, claim: Claim) -> None:
        self.state = state
        self.claim = claim
        # (request position, device number within the request) in the order the search fills them.
        self.slots = [
            (position, number)
            for position, request in enumerate(claim.requests)
            for number in range(request.count)
        ]
        self.candidates = [state._candidates_for(request) for request in claim.requests]
        self.taken: set[int] = set()
        self.new_shares: dict[int, int] = {}
        self.extra_counters: dict[tuple[str, str], int] = {}
        self.extra_capacity: dict[int, dict[str, int]] = {}
        self.constraint_values: list[AttributeValue | None] = [None] * len(claim.constraints)
        self.constraint_counts = [0] * len(claim.constraints)
        self.results: list[DeviceResult] = []
        self.deepest = 0

    def run(self) -> Allocation | Refusal:
        if self._place(0, 0):
            return Allocation(tuple(self.results))
        position, number = self.slots[self.deepest]
        request = self.claim.requests[position]
        found = len(self.candidates[position].indices)
        if found < request.count:
            return Refusal(
                f"request {request.name}: {found} of the node's devices match it, {request.count} needed"
            )
        return Refusal(f"request {request.name}: no free device fits device {number + 1} of {request.count}")

    def _place(self, slot: int, start: int) -> bool:
        if slot == len(self.slots):
            return True
        self.deepest = max(self.deepest, slot)
        position, number = self.slots[slot]
        request = self.claim.requests[position]
        candidates = self.candidates[position]
        indices = candidates.indices
        for at in range(start if number else 0, len(indices)):
            index = indices[at]
            undo = self._take(index, request, candidates.charged[index])
            if undo is None:
                continue
            if self._place(slot + 1, at + 1):
                return True
            undo()
        return False

    def _counters_fit(self, entry: _Entry) -> bool:
        if self.state._overdrawn:
            return False
        totals = self.state.pool.counter_sets
        used = self.state._used
        extra = self.extra_counters
        for counter_set, counter, amount in entry.draws:
            total = totals.get(counter_set, {}).get(counter)
            if total is None:
                return False
            taken = used.get(counter_set, {}).get(counter, 0) + extra.get((counter_set, counter), 0)
            if taken + amount > total:
                return False
        return True

    def _capacity_fits(self, index: int, entry: _Entry, charged: Mapping[str, int]) -> bool:
        aggregated = self.state._aggregated[index]
        extra = self.extra_capacity.get(index, {})
        return all(
            aggregated.get(name, 0) + extra.get(name, 0) + amount <= entry.capacities[name].value
            for name, amount in charged.items()
        )

    def _constraints_allow(self, request: Request, device: Device) -> list[int] | None:
        """The constraints this device joins, or None when one of them refuses it."""
        joined = []
        for number, constraint in enumerate(self.claim.constraints):
            if constraint.requests and request.name not in constraint.requests:
                continue
            value = _attribute(device, constraint.attribute, self.state.pool.driver)
            if value is None:
                return None
            first = self.constraint_values[number]
            if self.constraint_counts[number] and first is not None and not _same(first, value):
                return None
            joined.append(number)
        for number in joined:
            if not self.constraint_counts[number]:
                self.constraint_values[number] = _attribute(
                    device, self.claim.constraints[number].attribute, self.state.pool.driver
                )
            self.constraint_counts[number] += 1
        return joined

    def _take(self, index: int, request: Request, charged: Mapping[str, int]) -> Callable[[], None] | None:
        state = self.state
        entry = state._entries[index]
        if entry.shared:
            draws_counters = state._shares[index] == 0 and not self.new_shares.get(index)
            if not self._capacity_fits(index, entry, charged):
                return None
        else:
            if index in state._in_use or index in self.taken:
                return None
            draws_counters = True
        if draws_counters and entry.draws and not self._counters_fit(entry):
            return None
        joined = self._constraints_allow(request, entry.device)
        if joined is None:
            return None
        if draws_counters:
            for counter_set, counter, amount in entry.draws:
                key = (counter_set, counter)
                self.extra_counters[key] = self.extra_counters.get(key, 0) + amount
        if entry.shared:
            self.new_shares[index] = self.new_shares.get(index, 0) + 1
            extra = self.extra_capacity.setdefault(index, {})
            for name, amount in charged.items():
                extra[name] = extra.get(name, 0) + amount
        else:
            self.taken.add(index)
        self.results.append(
            DeviceResult(request.name, entry.device.name, dict(charged) if entry.shared else {})
        )

        def undo() -> None:
            self.results.pop()
            for number in joined:
                self.constraint_counts[number] -= 1
            if draws_counters:
                for counter_set, counter, amount in entry.draws:
                    self.extra_counters[(counter_set, counter)] -= amount
            if entry.shared:
                self.new_shares[index] -= 1
                for name, amount in charged.items():
                    self.extra_capacity[index][name] -= amount
            else:
                self.taken.discard(index)

        return undo


def allocate(pool: Pool, allocated: Iterable[Allocation], claim: Claim) -> Allocation | Refusal:
    """The scheduler's answer for `claim` on this pool, given what is already allocated."""
    return NodeState(pool, allocated).allocate(claim)
