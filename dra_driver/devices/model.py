"""DRA devices as the driver plans them, and their resource.k8s.io/v1 rendering.

Kept separate from the Kubernetes client models: planning compares, sums and sorts these
values as plain integers, and only the edge that talks to the API server (or prints YAML) turns
them into objects with quantity strings.
"""

from collections.abc import Mapping
from typing import Any, Literal

import msgspec


class Version(msgspec.Struct, frozen=True):
    """A semantic-version attribute (rendered as `version:`, compared as a version by CEL)."""

    text: str


AttributeValue = str | int | bool | Version

DeviceType = Literal["gpu", "mig", "vgpu", "vfio"]
TaintEffect = Literal["None", "NoSchedule", "NoExecute"]


class ValidRange(msgspec.Struct, frozen=True):
    minimum: int
    maximum: int
    step: int


class RequestPolicy(msgspec.Struct, frozen=True):
    """How much of a shareable capacity one allocation takes (KEP-5075 consumable capacity)."""

    default: int
    valid_range: ValidRange


class Capacity(msgspec.Struct, frozen=True):
    value: int
    request_policy: RequestPolicy | None = None


class CounterSet(msgspec.Struct, frozen=True):
    """Counters that devices of one GPU draw from, so the scheduler never over-commits it."""

    name: str
    counters: Mapping[str, int]


class CounterConsumption(msgspec.Struct, frozen=True):
    counter_set: str
    counters: Mapping[str, int]


class Taint(msgspec.Struct, frozen=True):
    key: str
    value: str
    effect: TaintEffect


class Device(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, Capacity]
    consumes_counters: tuple[CounterConsumption, ...] = ()
    allow_multiple_allocations: bool = False
    taints: tuple[Taint, ...] = ()
    # Which kind of device this is, for the driver's own decisions (opaque config kinds, what
    # prepare does). Set by the builder next to the published `type` attribute, never read back
    # from it: attributes are for users and may be renamed.
    type: DeviceType


def semantic_version(dotted: str) -> Version:
    """NVIDIA versions ('580.95.05', '9.0', '13.0') as semver 2.0.0, which forbids leading zeros."""
    numbers = [int(part) for part in dotted.split(".")[:3]]
    numbers += [0] * (3 - len(numbers))
    return Version(".".join(map(str, numbers)))


def quantity(value: int) -> str:
    """The quantity in the API server's canonical spelling (binary suffix where exact, else a
    decimal one where exact), so what the server stores reads back equal to what we sent and the
    slice controller never rewrites a slice over spelling."""
    for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    for suffix, factor in (
        ("E", 10**18),
        ("P", 10**15),
        ("T", 10**12),
        ("G", 10**9),
        ("M", 10**6),
        ("k", 10**3),
    ):
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def attribute_to_api(value: AttributeValue) -> dict[str, Any]:
    """A DeviceAttribute as the resource.k8s.io API spells it, one-of by type; KEP-5304's
    device metadata files use the same type, so they render through this too."""
    if isinstance(value, Version):
        return {"version": value.text}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def _capacity_to_api(capacity: Capacity) -> dict[str, Any]:
    rendered: dict[str, Any] = {"value": quantity(capacity.value)}
    if policy := capacity.request_policy:
        rendered["requestPolicy"] = {
            "default": quantity(policy.default),
            "validRange": {
                "min": quantity(policy.valid_range.minimum),
                "max": quantity(policy.valid_range.maximum),
                "step": quantity(policy.valid_range.step),
            },
        }
    return rendered


def _counters_to_api(counters: Mapping[str, int]) -> dict[str, Any]:
    return {name: {"value": quantity(value)} for name, value in counters.items()}


def device_to_api(device: Device) -> dict[str, Any]:
    """A resource.k8s.io/v1 Device object as a plain dict."""
    rendered: dict[str, Any] = {
        "name": device.name,
        "attributes": {name: attribute_to_api(value) for name, value in sorted(device.attributes.items())},
    }
    if device.capacity:
        rendered["capacity"] = {
            name: _capacity_to_api(capacity) for name, capacity in sorted(device.capacity.items())
        }
    if device.allow_multiple_allocations:
        rendered["allowMultipleAllocations"] = True
    if device.consumes_counters:
        rendered["consumesCounters"] = [
            {"counterSet": consumption.counter_set, "counters": _counters_to_api(consumption.counters)}
            for consumption in device.consumes_counters
        ]
    if device.taints:
        rendered["taints"] = [
            {"key": taint.key, "value": taint.value, "effect": taint.effect} for taint in device.taints
        ]
    return rendered


def counter_set_to_api(counter_set: CounterSet) -> dict[str, Any]:
    return {"name": counter_set.name, "counters": _counters_to_api(counter_set.counters)}
