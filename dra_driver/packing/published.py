"""A live node's pool, read back from its ResourceSlices as the API server stores them.

`plan` against a running node must see what the scheduler sees: the slices of the pool's newest
generation, in slice-name order, devices in listed order, with the capacities, counters and
taints as stored (an older agent, or a server that dropped a field, publishes something other
than what this version would render). Only what the allocator model reads is decoded.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from dra_driver.base import quantity as quantities
from dra_driver.base.errors import TransientFault
from dra_driver.devices import attributes as names
from dra_driver.devices.model import (
    AttributeValue,
    Capacity,
    CounterConsumption,
    Device,
    DeviceType,
    RequestPolicy,
    Taint,
    TaintEffect,
    ValidRange,
    Version,
)
from dra_driver.packing.allocator import Allocation, DeviceResult, Pool

_TYPES: Mapping[str, DeviceType] = {"gpu": "gpu", "mig": "mig", "vgpu": "vgpu"}
_EFFECTS: Mapping[str, TaintEffect] = {"None": "None", "NoSchedule": "NoSchedule", "NoExecute": "NoExecute"}


class PublishedSliceError(TransientFault, ValueError):
    """A stored slice this tool cannot read (a quantity with a fraction, say)."""


def parse_quantity(text: object, where: str) -> int:
    quantity = quantities.parse_quantity(str(text))
    value = quantity.whole_number() if quantity is not None else None
    if value is None:
        raise PublishedSliceError(f"{where}: quantity {text!r} is not a whole number such as 80Gi")
    return value


def _attribute(raw: Mapping[str, Any]) -> AttributeValue:
    if "version" in raw:
        return Version(str(raw["version"]))
    if "bool" in raw:
        return bool(raw["bool"])
    if "int" in raw:
        return int(raw["int"])
    return str(raw.get("string", ""))


def _capacity(raw: Mapping[str, Any], where: str) -> Capacity:
    value = parse_quantity(raw.get("value"), f"{where}.value")
    policy = raw.get("requestPolicy")
    if not policy:
        return Capacity(value)
    valid = policy.get("validRange") or {}
    minimum = parse_quantity(valid.get("min", 0), f"{where}.requestPolicy.validRange.min")
    return Capacity(
        value,
        RequestPolicy(
            default=parse_quantity(policy.get("default", value), f"{where}.requestPolicy.default"),
            valid_range=ValidRange(
                minimum,
                parse_quantity(valid.get("max", value), f"{where}.requestPolicy.validRange.max"),
                parse_quantity(valid.get("step", 1), f"{where}.requestPolicy.validRange.step"),
            ),
        ),
    )


def _counters(raw: Mapping[str, Any], where: str) -> dict[str, int]:
    return {name: parse_quantity(counter.get("value"), f"{where}.{name}") for name, counter in raw.items()}


def parse_device(raw: Mapping[str, Any], where: str) -> Device:
    attributes = {name: _attribute(value) for name, value in (raw.get("attributes") or {}).items()}
    return Device(
        name=str(raw["name"]),
        type=_TYPES.get(str(attributes.get(names.TYPE, "gpu")), "gpu"),
        attributes=attributes,
        capacity={
            name: _capacity(value, f"{where}.capacity.{name}")
            for name, value in (raw.get("capacity") or {}).items()
        },
        consumes_counters=tuple(
            CounterConsumption(
                str(consumption["counterSet"]), _counters(consumption.get("counters") or {}, where)
            )
            for consumption in raw.get("consumesCounters") or []
        ),
        allow_multiple_allocations=bool(raw.get("allowMultipleAllocations", False)),
        taints=tuple(
            Taint(
                str(taint.get("key", "")),
                str(taint.get("value", "")),
                _EFFECTS.get(taint.get("effect"), "None"),
            )
            for taint in raw.get("taints") or []
        ),
    )


def pool_from_slices(slices: Iterable[Mapping[str, Any]], driver: str) -> Pool:
    """The pool of the newest generation among `slices` (one node's slices of one driver)."""
    listed = list(slices)
    newest = max((int(s["spec"]["pool"]["generation"]) for s in listed), default=0)
    current = sorted(
        (s for s in listed if int(s["spec"]["pool"]["generation"]) == newest),
        key=lambda s: str(s["metadata"]["name"]),
    )
    devices = []
    counter_sets: dict[str, dict[str, int]] = {}
    for stored in current:
        name = stored["metadata"]["name"]
        spec = stored["spec"]
        for number, device in enumerate(spec.get("devices") or []):
            devices.append(parse_device(device, f"resourceslice {name} devices[{number}]"))
        for counter_set in spec.get("sharedCounters") or []:
            where = f"resourceslice {name} sharedCounters {counter_set['name']}"
            counter_sets[str(counter_set["name"])] = _counters(counter_set.get("counters") or {}, where)
    return Pool(driver=driver, devices=tuple(devices), counter_sets=counter_sets)


def allocations_from_claims(
    claims: Iterable[Mapping[str, Any]], driver: str, node: str
) -> list[tuple[Allocation, str]]:
    """What allocated claims hold of this node's pool, each with `claim <namespace>/<name>`.

    Only results of this driver and this node's pool count: a claim may hold devices of other
    drivers and nodes too. A share's consumed capacity is read back, so shares are charged what
    the scheduler charged them."""
    held = []
    for claim in claims:
        metadata = claim.get("metadata") or {}
        where = f"resourceclaim {metadata.get('namespace', '')}/{metadata.get('name', '')}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = tuple(
            DeviceResult(
                str(result.get("request", "")),
                str(result["device"]),
                {
                    name: parse_quantity(value, f"{where} consumedCapacity.{name}")
                    for name, value in (result.get("consumedCapacity") or {}).items()
                },
            )
            for result in (allocation.get("devices") or {}).get("results") or []
            if result.get("driver") == driver and result.get("pool") == node
        )
        if results:
            held.append((Allocation(results), f"claim {where.removeprefix('resourceclaim ')}"))
    return held
