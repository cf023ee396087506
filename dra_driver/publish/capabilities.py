"""What the API server can store, worked out from what it says and what it does.

Two facts decide whether published slices stay as published, and neither is in the slices:
- the server's version picks the slice layout (1.34 and 1.35 disagree on where counter sets go);
- a feature gate that is off makes the server drop that feature's fields while storing a slice,
  without an error. Publishing the same slice again gets the same answer, so a controller that
  only compares would rewrite forever. Comparing what was sent with what was stored tells which
  gates are off; the GPUs that need them are then offered in a mode the server can store, and the
  operator is told once, instead of the node publishing devices the scheduler sees half of.

Pure functions: the controller does the requests, logging and events.
"""

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeGuard, get_args

from msgspec.structs import replace

from dra_driver.base.errors import TransientFault
from dra_driver.devices.modes.registry import MODES, mode_named
from dra_driver.devices.node_config import GpuPlan, ResolvedMode

ApiFeature = Literal[
    "DRAConsumableCapacity", "DRAPartitionableDevices", "DRADeviceTaints", "DRAPartitionableDevicesType"
]
# Features whose fields only help tools show the pool (the devices and what claims get are the same
# without them): a server without them is normal, not something to warn the operator about.
# DRAPartitionableDevicesType is alpha, so off by default, in Kubernetes 1.37.
DISPLAY_ONLY_FEATURES: frozenset[ApiFeature] = frozenset({"DRAPartitionableDevicesType"})
# The first release whose schema has ResourceSlice spec.partitionTypeAttribute: older servers
# refuse it as an unknown field instead of dropping it, so it is never sent to them.
PARTITION_TYPE_SINCE = (1, 37)

# resource.k8s.io/v1, the only version the driver publishes, is served from this release.
OLDEST_SERVER = (1, 34)
MAX_PATHS_DESCRIBED = 5


class ServerVersionError(TransientFault, ValueError):
    """The API server's version cannot be read, or it cannot serve the driver's API version."""


# Managed clusters (GKE, EKS) report minor versions such as "35+".
_VERSION_NUMBER = re.compile(r"([0-9]+)\+?")
_GIT_VERSION = re.compile(r"v?([0-9]+)\.([0-9]+)(?:\.[0-9]+)?(?:[-+].*)?")


def _version_number(value: object) -> int | None:
    match = _VERSION_NUMBER.fullmatch(value) if isinstance(value, str) else None
    return int(match[1]) if match else None


def server_kubernetes_version(version_info: Mapping[str, object]) -> tuple[int, int]:
    """(major, minor) from the JSON of GET /version.

    major/minor come first because they are what the server promises to be compatible with;
    gitVersion is the fallback for distributions that leave them empty or put text in them.
    """
    major = _version_number(version_info.get("major"))
    minor = _version_number(version_info.get("minor"))
    git_version = version_info.get("gitVersion")
    if major is None or minor is None:
        match = _GIT_VERSION.fullmatch(git_version) if isinstance(git_version, str) else None
        if match is None:
            raise ServerVersionError(
                "cannot tell the API server's Kubernetes version from GET /version: expected major and "
                'minor such as "1" and "35", or gitVersion such as "v1.35.2"; got '
                f"major={version_info.get('major')!r}, minor={version_info.get('minor')!r}, "
                f"gitVersion={git_version!r}"
            )
        major, minor = int(match[1]), int(match[2])
    if (major, minor) < OLDEST_SERVER:
        raise ServerVersionError(
            "this driver publishes resource.k8s.io/v1 ResourceSlices, and Kubernetes serves "
            f"resource.k8s.io/v1 only from Kubernetes {OLDEST_SERVER[0]}.{OLDEST_SERVER[1]}; "
            f"this API server is {major}.{minor} (gitVersion {git_version!r})"
        )
    return major, minor


# Maps whose keys are names chosen by the driver (capacity names, counter names), not API fields;
# paths show them in brackets because such names may contain dots.
_NAMED_MAPS = frozenset({"attributes", "capacity", "counters"})
# Lists whose items are matched by a name: the server keeps order, but a position in a path
# would say nothing to the operator, and a dropped item would shift every later position.
_LIST_ITEM_KEYS = {"devices": "name", "sharedCounters": "name", "consumesCounters": "counterSet"}


def _is_zero(value: Any) -> bool:
    """The server leaves zero values out of what it stores (omitempty), so their absence is no drop."""
    return value in (None, False, 0, "") or (isinstance(value, Mapping | list) and not value)


def _children(field: str | None, value: Any) -> dict[str, tuple[str | None, Any]] | None:
    """The parts of a value that can be matched between sent and stored, by path suffix, each
    with its API field name (None where the part is an item, not a field). None for a scalar."""
    if isinstance(value, Mapping):
        if field in _NAMED_MAPS:
            return {f"[{key}]": (None, item) for key, item in value.items()}
        return {f".{key}": (key, item) for key, item in value.items()}
    if isinstance(value, list):
        item_key = _LIST_ITEM_KEYS.get(field or "")
        if item_key is None:
            return {f"[{position}]": (None, item) for position, item in enumerate(value)}
        return {
            f"[{item[item_key]}]": (None, item)
            for item in value
            if isinstance(item, Mapping) and item_key in item
        }
    return None


def _drops(field: str | None, sent: Any, stored: Any, path: str) -> Iterator[str]:
    sent_children, stored_children = _children(field, sent), _children(field, stored)
    # Scalars, and a value whose type changed, were stored in some form: not a drop.
    if sent_children is None or stored_children is None:
        return
    for suffix, (child_field, value) in sent_children.items():
        if suffix in stored_children:
            yield from _drops(child_field, value, stored_children[suffix][1], path + suffix)
        elif not _is_zero(value):
            yield path + suffix


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> tuple[str, ...]:
    """Paths of what the slice we sent has in its spec and the stored one lacks, outermost only.

    Only absence counts: the server fills in fields (taints' timeAdded) and re-spells quantities
    ("1Gi" as "1073741824"), and mistaking those for drops would blame a gate for nothing.
    """
    return tuple(_drops(None, sent.get("spec", {}), stored.get("spec", {}), "spec"))


_GATE_OF_FIELD: Mapping[str, ApiFeature] = {
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "sharedCounters": "DRAPartitionableDevices",
    "consumesCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "taints": "DRADeviceTaints",
    "partitionTypeAttribute": "DRAPartitionableDevicesType",
}
# A gate drops whole fields, so only a path that ends in a field name can be its doing; one that
# ends in a name or position ("taints[0]", "capacity[requestPolicy]") is something else.
_LAST_FIELD = re.compile(r"\.([A-Za-z]+)$")


def _gate_of(path: str) -> ApiFeature | None:
    match = _LAST_FIELD.search(path)
    return _GATE_OF_FIELD.get(match[1]) if match else None


def features_behind(paths: Iterable[str]) -> frozenset[ApiFeature]:
    """The feature gates that being off would explain these drops."""
    return frozenset(gate for path in paths if (gate := _gate_of(path)) is not None)


def sends_partition_types(
    kubernetes_version: tuple[int, int] | None, unsupported: frozenset[ApiFeature]
) -> bool:
    """Whether slices name their partition-type attribute: on a server whose schema has the field,
    until it is found to drop it (gate off); the first slice stored tells."""
    return (
        kubernetes_version is not None
        and kubernetes_version >= PARTITION_TYPE_SINCE
        and "DRAPartitionableDevicesType" not in unsupported
    )


def unexplained(paths: Iterable[str]) -> tuple[str, ...]:
    """Drops no known gate explains, so the operator hears about them instead of a wrong guess."""
    return tuple(path for path in paths if _gate_of(path) is None)


def describe_drops(paths: Sequence[str], features: frozenset[ApiFeature]) -> str:
    """One line for the log, the Event and the metric: a few paths are enough to recognise the
    problem, and a slice with hundreds of devices would otherwise make an unreadable message."""
    shown = ", ".join(paths[:MAX_PATHS_DESCRIBED])
    if len(paths) > MAX_PATHS_DESCRIBED:
        shown += f" and {len(paths) - MAX_PATHS_DESCRIBED} more"
    gates = sorted(features)
    if not gates:
        cause = "no known feature gate explains this"
    elif len(gates) == 1:
        cause = f"feature gate {gates[0]} is probably off"
    else:
        cause = f"feature gates {', '.join(gates)} are probably off"
    return f"the API server dropped fields of the ResourceSlice it stored: {shown}; {cause}"


def _gate(name: str) -> ApiFeature:
    """A mode's fallback gate (devices.modes), which the devices layer names as a string."""
    if not _is_feature(name):
        known = ", ".join(get_args(ApiFeature))
        raise ValueError(f"{name!r} is not a feature gate this driver knows: {known}")
    return name


def _is_feature(name: str) -> TypeGuard[ApiFeature]:
    return name in get_args(ApiFeature)


# The next mode to try when the server cannot store a mode's devices, and the gate that needs to
# be on, by mode (each mode's module says why).
_FALLBACKS: Mapping[ResolvedMode, tuple[ResolvedMode, ApiFeature]] = {
    mode.name: (mode.fallback.mode, _gate(mode.fallback.gate)) for mode in MODES if mode.fallback is not None
}
_DROPPED_BY: Mapping[ApiFeature, str] = {
    "DRAConsumableCapacity": "consumable-capacity fields",
    "DRAPartitionableDevices": "shared-counter fields",
}


# Releases whose scheduler misallocates what a feature's fields say although the API server stores
# them, and why: the GPUs that need the feature fall back as if the server dropped its fields.
# Found by running the e2e suite on a real 1.34.4 cluster: its allocator (allocator_experimental,
# used when DRAConsumableCapacity is on) checks a request against the capacity of device
# number <the request's device count so far> of the ResourceSlice instead of the device it picked,
# so a vGPU share fits only the first device of a slice; 1.35.4 passes the device itself.
_MISALLOCATED: Mapping[tuple[int, int], Mapping[ApiFeature, str]] = {
    (1, 34): {
        "DRAConsumableCapacity": "Kubernetes 1.34's scheduler checks a share's capacity against another "
        "device of its ResourceSlice than the one it allocates (fixed in 1.35)",
    },
}


def misallocated(kubernetes_version: tuple[int, int] | None) -> Mapping[ApiFeature, str]:
    """The features this server version's scheduler cannot be trusted with, each with the reason."""
    return _MISALLOCATED.get(kubernetes_version, {}) if kubernetes_version is not None else {}


def _fall_back_plan(
    plan: GpuPlan, unsupported: frozenset[ApiFeature], broken: Mapping[ApiFeature, str]
) -> tuple[GpuPlan, str | None]:
    mode = plan.mode
    gates: list[ApiFeature] = []
    while (step := _FALLBACKS.get(mode)) is not None and (step[1] in unsupported or step[1] in broken):
        mode = step[0]
        gates.append(step[1])
    if not gates:
        return plan, None
    settings = mode_named(mode).entered(plan.gpu, replace(plan.settings, mode=mode))
    dropped = [f"{_DROPPED_BY[gate]} (feature gate {gate} is off)" for gate in gates if gate not in broken]
    reasons = [broken[gate] for gate in gates if gate in broken]
    if dropped:
        reasons.append(f"the API server drops {' and '.join(dropped)}")
    note = f"{plan.gpu.label}: offered as {mode} instead of {plan.mode}: {'; '.join(reasons)}"
    return replace(plan, mode=mode, settings=settings), note


def fall_back(
    plans: Sequence[GpuPlan],
    unsupported: frozenset[ApiFeature],
    kubernetes_version: tuple[int, int] | None = None,
) -> tuple[tuple[GpuPlan, ...], tuple[str, ...]]:
    """Each GPU in a mode whose devices the server stores whole, and a note for each GPU moved.

    Moving to a mode with less sharing beats publishing devices the scheduler would misread: a
    capacity-mode GPU stripped of allowMultipleAllocations and its request policies can no longer
    be shared, and MIG or vGPU devices stripped of their counter consumption can be allocated
    together past what the GPU holds. Device taints move nothing: without them the devices are
    still right, only not marked unhealthy.
    """
    broken = misallocated(kubernetes_version)
    results = [_fall_back_plan(plan, unsupported, broken) for plan in plans]
    return tuple(plan for plan, _ in results), tuple(note for _, note in results if note is not None)
