"""The allocator model's values: what a claim asks (requests, their selectors and capacity,
matchAttribute constraints), the pool it asks of (one driver's devices on one node, in the order
the allocator tries them, with the counter sets), and the answer (an allocation, or a refusal in
one line).

Apart from the search (`allocator.py`, `NodeState`) because they are what every user of the
model builds and reads, searching or not: claims from pod shapes and traces, pools from planned
or published slices, allocations read back from claims' status (`published.py`,
`tools/cluster_reads.py` build pools and allocations and never search). `allocator.py`
re-exports them, where their callers import them from.
"""

from collections.abc import Callable, Mapping, Sequence

import msgspec

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device
from dra_driver.devices.slices import PlannedSlice, SliceLayout, plan_slices

# A device class's and a request's CEL selectors, as one predicate (tests may compile real CEL).
Selector = Callable[[Device], bool]


def any_device(device: Device) -> bool:
    return True


class Request(msgspec.Struct, frozen=True):
    name: str
    selector: Selector = any_device
    count: int = 1
    # capacity.requests: capacity name -> amount (bytes for memory, plain numbers otherwise).
    capacity: Mapping[str, int] = msgspec.field(default_factory=dict)


class MatchAttribute(msgspec.Struct, frozen=True):
    """All devices of the named requests (all requests when empty) share this attribute's value."""

    attribute: str
    requests: tuple[str, ...] = ()


class Claim(msgspec.Struct, frozen=True):
    requests: tuple[Request, ...]
    constraints: tuple[MatchAttribute, ...] = ()


class DeviceResult(msgspec.Struct, frozen=True):
    request: str
    device: str
    # What a share of a shared device consumed; empty for a device allocated whole.
    consumed: Mapping[str, int] = msgspec.field(default_factory=dict)


class Allocation(msgspec.Struct, frozen=True):
    results: tuple[DeviceResult, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(result.device for result in self.results)


class Refusal(msgspec.Struct, frozen=True):
    """Why the claim does not fit now, in one line."""

    reason: str


class Pool(msgspec.Struct, frozen=True):
    """One driver's pool on one node, with its devices in the order the allocator tries them."""

    driver: str
    devices: tuple[Device, ...]
    counter_sets: Mapping[str, Mapping[str, int]]

    @classmethod
    def from_slices(cls, slices: Sequence[PlannedSlice], driver: str) -> "Pool":
        """`slices` in plan order, which is their name order once published."""
        return cls(
            driver=driver,
            devices=tuple(device for planned in slices for device in planned.devices),
            counter_sets={
                counter_set.name: dict(counter_set.counters)
                for planned in slices
                for counter_set in planned.counter_sets
            },
        )

    @classmethod
    def from_inventory(cls, inventory: Inventory, driver: str, layout: SliceLayout = "1.35") -> "Pool":
        return cls.from_slices(plan_slices(inventory, layout), driver)
