"""DRA devices as the driver plans them, and their resource.k8s.io/v1 rendering.

Kept separate from the Kubernetes client models: planning compares and sorts these values,
and only the edge that talks to the API server (or prints YAML) turns them into objects.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic-version attribute (rendered as `version:`, compared as a version by CEL)."""

    text: str


AttributeValue = str | int | bool | Version


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    attributes: Mapping[str, AttributeValue]
    # Capacity values are Kubernetes quantities in their canonical text form.
    capacity: Mapping[str, str]


def semantic_version(dotted: str) -> Version:
    """NVIDIA versions ('580.95.05', '9.0', '13.0') as semver 2.0.0, which forbids leading zeros."""
    numbers = [int(part) for part in dotted.split(".")[:3]]
    numbers += [0] * (3 - len(numbers))
    return Version(".".join(map(str, numbers)))


def bytes_quantity(value: int) -> str:
    """The shortest exact binary-suffixed quantity, as the API server would print it."""
    for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def _attribute_to_api(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, Version):
        return {"version": value.text}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def device_to_api(device: Device) -> dict[str, Any]:
    """A resource.k8s.io/v1 Device object as a plain dict."""
    rendered: dict[str, Any] = {
        "name": device.name,
        "attributes": {name: _attribute_to_api(value) for name, value in sorted(device.attributes.items())},
    }
    if device.capacity:
        rendered["capacity"] = {name: {"value": value} for name, value in sorted(device.capacity.items())}
    return rendered
