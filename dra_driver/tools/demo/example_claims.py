"""`demo --claim FILE` for a file the way users write them: ResourceClaimTemplates (with their
pods) or ResourceClaims not yet allocated, as in deploy/examples. The demo then does the
scheduler's part on its node: each claim's requests get devices of their class, first fit, and
the claim is written out allocated, with its class's and its own configs, as the scheduler
leaves it. Pure: the node's GPUs in, allocated claims out.

The driver has no CEL engine (the scheduler evaluates selectors), so of a request's selectors
only the plainest kind is read, an attribute of ours equal to a string (the examples' MIG profile:
`device.attributes["gpu.dra-driver.dev"].profile == "1g.10gb"`); other selectors and a claim's
constraints are not evaluated: the first devices of the class are taken, and the demo says so.
The real scheduler's choice on a real cluster may differ; what prepare then does with the
devices is the same.
"""

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.devices.classes import (
    CONTAINER_DEVICE_TYPES,
    SHARING_CLASSES,
    class_name,
    device_classes,
    sharing_class_name,
)
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device, DeviceType
from dra_driver.hardware.model import Gpu
from dra_driver.tools.demo.sample_claims import (
    CLAIM_KINDS,
    ClaimKind,
    SampleClaimError,
    allocated_claim,
    candidate_configs,
    default_share,
    offered_inventory,
)

# Claim UIDs and share IDs derive from the claim's name, so a run prints the same CDI IDs on every
# machine, as the sample claims do.
_NAMESPACE_UUID = uuid.UUID("6f0c2b9e-4d3a-4e71-9a5b-2c8d1e7f3a40")


# A claim to allocate: its name, its spec, and its requests as allocation results name them.
_Wanted = tuple[str, dict[str, Any], list[tuple[str, dict[str, Any]]]]


class ExampleClaims(msgspec.Struct, frozen=True):
    claims: tuple[dict[str, Any], ...]
    # The node configuration that makes the node offer the kind asked for; None: the default.
    node_config: dict[str, Any] | None
    # What the demo did in the scheduler's place that a user should know (selectors not read).
    notes: tuple[str, ...]


def unallocated_specs(documents: Sequence[object]) -> list[tuple[str, dict[str, Any]]] | None:
    """(name, claim spec) of each template and unallocated claim in the file; None when the file
    holds allocated claims only (the demo prepares those as they are). Pods and other objects are
    what the examples bring beside their claims, and are passed over."""
    specs: list[tuple[str, dict[str, Any]]] = []
    allocated = False
    for document in documents:
        if not isinstance(document, Mapping):
            continue
        kind, metadata = document.get("kind"), document.get("metadata") or {}
        spec = document.get("spec") or {}
        if kind == "ResourceClaimTemplate":
            specs.append((str(metadata.get("name", "claim")), dict(spec.get("spec") or {})))
        elif kind == "ResourceClaim":
            if (document.get("status") or {}).get("allocation"):
                allocated = True
            else:
                specs.append((str(metadata.get("name", "claim")), dict(spec)))
    if allocated and specs:
        raise SampleClaimError(
            "claim file: mixes allocated ResourceClaims with templates or unallocated claims"
        )
    return specs or None


def _kind_of_class(driver: str) -> dict[str, ClaimKind]:
    """The demo's kinds of claim by class: the shipped classes' (a device type without one, as a
    VM's GPU, is no kind of the demo's: no container gets it)."""
    kinds = {class_name(t, driver): CLAIM_KINDS[t] for t in CONTAINER_DEVICE_TYPES if t in CLAIM_KINDS}
    kinds.update({sharing_class_name(prefix, driver): "gpu" for prefix in SHARING_CLASSES})
    return kinds


def _requests(name: str, spec: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(result request name, request) of each request: `exactly`, or a `firstAvailable` request's
    first alternative (`<request>/<subrequest>`, as allocation results name it)."""
    found = []
    for request in (spec.get("devices") or {}).get("requests") or []:
        if "exactly" in request:
            found.append((str(request["name"]), dict(request["exactly"])))
        elif alternatives := request.get("firstAvailable"):
            found.append((f"{request['name']}/{alternatives[0]['name']}", dict(alternatives[0])))
        else:
            raise SampleClaimError(
                f"claim {name}: request {request.get('name')!r} has neither exactly nor firstAvailable"
            )
    return found


def example_claims(
    specs: Sequence[tuple[str, dict[str, Any]]], gpus: Sequence[Gpu], pool: str, driver: str, node: str
) -> ExampleClaims:
    """The claims of `specs` allocated on the node of `gpus`, under a node config that offers the
    one kind of device they ask for (the demo runs one node config). Raises SampleClaimError when
    a request names a class of another driver, the claims ask for several kinds, or the node
    cannot offer enough devices."""
    kinds = _kind_of_class(driver)
    wanted: list[_Wanted] = [(name, spec, _requests(name, spec)) for name, spec in specs]
    types = set()
    for name, _, requests in wanted:
        for request_name, request in requests:
            if request.get("deviceClassName") not in kinds:
                raise SampleClaimError(
                    f"claim {name}: request {request_name}: class {request.get('deviceClassName')!r} is not "
                    f"one of {driver}'s ({', '.join(sorted(kinds))})"
                )
            types.add(kinds[request["deviceClassName"]])
    if len(types) != 1:
        raise SampleClaimError(
            f"claim file: asks for {', '.join(sorted(types)) or 'no devices'}; the demo runs one node "
            "config, so give it claims of one kind of device (gpu, mig or vgpu)"
        )
    (kind,) = types
    for raw_config in candidate_configs(gpus, kind):
        inventory = offered_inventory(gpus, raw_config)
        if inventory is None:
            continue
        try:
            claims, notes = _allocate(wanted, inventory, kind, pool, driver)
        except _NotEnough:
            continue
        return ExampleClaims(tuple(claims), raw_config, tuple(notes))
    raise SampleClaimError(f"claim file: {node} cannot offer the {kind} devices these claims ask for")


class _NotEnough(OperatorFault):
    pass


def _plain_selector(expression: str, driver: str) -> tuple[str, str] | None:
    """(attribute, value) of `device.attributes["<driver>"].<attribute> == "<value>"`, or None."""
    pattern = rf'device\.attributes\["{re.escape(driver)}"\]\.(\w+) == "([^"\\]*)"'
    match = re.fullmatch(pattern, expression.strip())
    return (match[1], match[2]) if match else None


def _allocate(
    wanted: Sequence[_Wanted],
    inventory: Inventory,
    kind: DeviceType,
    pool: str,
    driver: str,
) -> tuple[list[dict[str, Any]], list[str]]:
    free = [device for device in inventory.devices if device.type == kind]
    class_configs = {
        item["metadata"]["name"]: item["spec"].get("config", []) for item in device_classes(driver)
    }
    claims, notes = [], []
    for name, spec, requests in wanted:
        results, configs = [], []
        for request_name, request in requests:
            expressions = [
                selector.get("cel", {}).get("expression", "") for selector in request.get("selectors") or []
            ]
            plain = [_plain_selector(expression, driver) for expression in expressions]
            chosen = _take(free, request, [pair for pair in plain if pair is not None])
            if None in plain:
                notes.append(
                    f"claim {name}: request {request_name}: selectors not evaluated (the scheduler's "
                    f"part); took {', '.join(device.name for device in chosen)}"
                )
            results += [_result(device, request_name, request, pool, driver, name) for device in chosen]
            configs += [
                {
                    "source": "FromClass",
                    "requests": [request_name.partition("/")[0]],
                    "opaque": entry["opaque"],
                }
                for entry in class_configs[request["deviceClassName"]]
            ]
        if (spec.get("devices") or {}).get("constraints"):
            notes.append(f"claim {name}: constraints not evaluated (the scheduler's part)")
        configs += [
            {"source": "FromClaim", "requests": list(entry.get("requests") or []), "opaque": entry["opaque"]}
            for entry in (spec.get("devices") or {}).get("config") or []
            if "opaque" in entry
        ]
        claims.append(allocated_claim(name, str(uuid.uuid5(_NAMESPACE_UUID, name)), spec, results, configs))
    return claims, notes


def _take(free: list[Device], request: Mapping[str, Any], equal: Sequence[tuple[str, str]]) -> list[Device]:
    """First fit among the devices whose attributes are `equal`; a shareable vGPU stays free for
    the next share."""
    fitting = [
        device for device in free if all(device.attributes.get(name) == value for name, value in equal)
    ]
    count = len(fitting) if request.get("allocationMode") == "All" else int(request.get("count", 1))
    chosen = fitting[:count]
    if len(chosen) < count or not chosen:
        raise _NotEnough
    for device in chosen:
        if not device.allow_multiple_allocations:
            free.remove(device)
    return chosen


def _result(
    device: Device, request_name: str, request: Mapping[str, Any], pool: str, driver: str, claim: str
) -> dict[str, Any]:
    result: dict[str, Any] = {"request": request_name, "driver": driver, "pool": pool, "device": device.name}
    if request.get("adminAccess"):
        result["adminAccess"] = True
    if device.allow_multiple_allocations:
        asked = dict(((request.get("capacity") or {}).get("requests")) or {})
        result["shareID"] = str(uuid.uuid5(_NAMESPACE_UUID, f"{claim}/{request_name}/{device.name}"))
        result["consumedCapacity"] = {**default_share(device), **asked}
    return result
