"""A small, strict stand-in for the Kubernetes API server.

It speaks the real REST protocol (paths, verbs, Status objects, resourceVersion, UIDs, watch
streams), so the driver and the tests use the official `kubernetes` client against it unchanged.
It is strict where the real server is: objects are validated against the upstream OpenAPI schemas
of the server's version (`kubernetes-validate`, unknown fields refused), names must be valid, stale
resourceVersions and failed delete preconditions conflict, claim specs are immutable, the status
subresource is separate, and fields of disabled feature gates are dropped before validation as
the real server drops them. What it does not implement (set-based label selectors, dry runs) it
refuses rather than ignores, so a test cannot pass on behaviour the real server would not have.

It serves ResourceClaims, ResourceSlices, Nodes, core/v1 Events and Pods: get, list and watch
(field selectors, equality-based label selectors, history from a resourceVersion, bookmarks,
timeouts, 410 after compaction), create (generateName too), update and delete (preconditions
too). Tests make it misbehave through
`faults` and `drop_watches()` / `expire_watches()` / `compact()`, and inspect it through
`objects()`, `writes()` and `request_count()`.

Run it in a background thread (`ApiServer.start()`) for tests, or as a process
(`python -m tests.support.apiserver`) where it must not share the GIL with what it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime
import enum
import json
import math
import random
import re
import sys
import threading
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import kubernetes_validate
import yaml
from aiohttp import web
from kubernetes_validate.utils import all_versions

from dra_driver.kube.k8s_names import dns_label_problem, dns_subdomain_problem
from tests.support import apiserver_rules, release_records

Obj = dict[str, Any]

DEFAULT_VERSION = "1.36"
# The feature gates whose fields this stand-in drops when they are disabled (see _GATED_FIELDS and
# _GATED_FIELDS_OF_KIND).
FEATURE_GATES = frozenset(
    {
        "DRAConsumableCapacity",
        "DRADeviceTaints",
        "DRAPartitionableDevices",
        "DRAExtendedResource",
        "DRAPartitionableDevicesType",
        "DRAResourceClaimDeviceStatus",
    }
)
# Per gate: the first minor version that has it (and its field), and the first whose default
# turns it on (None: off by default in every version served here). From kube_features and the
# KEPs: DRAExtendedResource alpha 1.34, beta and on 1.36; DRAPartitionableDevicesType alpha 1.37,
# off (KEP-5677); DRAResourceClaimDeviceStatus beta and on since 1.33. The three older gates are
# treated as on from 1.35, as before.
_GATE_HISTORY: dict[str, tuple[int, int | None]] = {
    "DRAConsumableCapacity": (34, 35),
    "DRADeviceTaints": (34, 35),
    "DRAPartitionableDevices": (34, 35),
    "DRAExtendedResource": (34, 36),
    "DRAPartitionableDevicesType": (37, None),
    "DRAResourceClaimDeviceStatus": (34, 34),
}
# Watch events kept per resource type, so that watches can resume from a resourceVersion; a watch
# from before the oldest kept event gets 410 Expired, as after an etcd compaction.
HISTORY_LIMIT = 1000

_SERVER_OWNED_METADATA = ("uid", "creationTimestamp", "name", "namespace", "generation")
_WRITE_VERBS = frozenset({"POST", "PUT", "DELETE"})
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})  # what Go's strconv.ParseBool takes as true
# Names from generateName as the real server makes them (k8s.io/apiserver/pkg/storage/names): at
# most 58 characters of the prefix, then 5 from an alphabet without vowels and look-alikes.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_NAME_SUFFIX_LENGTH = 5
_MAX_NAME_PREFIX = 63 - _NAME_SUFFIX_LENGTH
# The real server tries another generated name when one is taken (RetryGenerateName), this often.
_NAME_ATTEMPTS = 8
_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool
    immutable_spec: bool
    # Field labels a fieldSelector may use besides metadata.name (and metadata.namespace).
    selectable_fields: tuple[str, ...] = ()
    # Whether metadata.generation counts the changes of the spec.
    has_generation: bool = False
    # Whether kubernetes-validate has its schema; a custom resource's is the CRD's, not upstream's.
    upstream_schema: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def field_labels(self) -> frozenset[str]:
        namespace = ("metadata.namespace",) if self.namespaced else ()
        return frozenset(("metadata.name", *namespace, *self.selectable_fields))


RESOURCE_TYPES = (
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, True, True),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        False,
        False,
        selectable_fields=("spec.driver", "spec.nodeName"),
        has_generation=True,
    ),
    ResourceType("", "v1", "nodes", "Node", False, True, False),
    ResourceType(
        "",
        "v1",
        "events",
        "Event",
        True,
        False,
        False,
        selectable_fields=(
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ),
    ),
    # Only what `dra-driver cleanup` asks about agent pods: listed by label, node and phase.
    ResourceType(
        "", "v1", "pods", "Pod", True, True, False, selectable_fields=("spec.nodeName", "status.phase")
    ),
)
# Field labels that are not the JSON path of their value.
_FIELD_PATHS = {"source": "source.component"}

# What an installation of the driver creates (`dra-driver manifests`, the Helm chart), served
# only when a test asks for them (`ApiServer(install_types=True)`): stored and validated like the
# rest, with no controller behind them. Helm's release records (Secrets) are kept apart.
INSTALL_RESOURCE_TYPES = (
    ResourceType("", "v1", "namespaces", "Namespace", False, True, False),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, False, False),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, False, False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, False, False),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, False, False
    ),
    # The agent's own namespace's Role for its MPS daemon pods.
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True, False, False),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, False, False),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        False,
        True,
        False,
        has_generation=True,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        False,
        False,
        False,
        has_generation=True,
    ),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, True, False, has_generation=True),
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, False, False),
    # The Prometheus Operator's, as if its CRD were installed; stored unvalidated.
    ResourceType(
        "monitoring.coreos.com", "v1", "podmonitors", "PodMonitor", True, False, False, upstream_schema=False
    ),
    ResourceType(
        "monitoring.coreos.com",
        "v1",
        "prometheusrules",
        "PrometheusRule",
        True,
        False,
        False,
        upstream_schema=False,
    ),
)


def status_object(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    status: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    return status


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None):
        super().__init__(message)
        self.code, self.reason, self.details = code, reason, details or {}

    def status(self) -> Obj:
        return status_object(self.code, self.reason, str(self), self.details)

    def response(self) -> web.Response:
        return web.json_response(self.status(), status=self.code)


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _invalid(rtype: ResourceType, detail: str) -> ApiError:
    """`detail` is `<field>: <what is wrong>`; the field goes to details.causes too."""
    details = {"kind": rtype.kind, "group": rtype.group, "causes": apiserver_rules.causes(detail)}
    return ApiError(422, "Invalid", f"{rtype.kind} is invalid: {detail}", details)


def _conflict(rtype: ResourceType, name: str, problem: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rtype.group_resource} "{name}": {problem}',
        {"name": name, "group": rtype.group, "kind": rtype.plural},
    )


FaultCounter = Literal["fail_next", "conflict_next", "fail_after_commit_next"]


@dataclass
class Faults:
    """Knobs tests turn to make the server misbehave; the counters count down as faults happen."""

    latency_seconds: float = 0.0
    # Answers the next N requests with this status code, before doing anything. Only requests whose
    # method is in fail_methods count (None: all but watches; a watch's method is "WATCH").
    fail_next: int = 0
    fail_status: int = 500
    fail_methods: frozenset[str] | None = None
    # The next N updates or deletes of existing objects conflict, as if another writer came first.
    conflict_next: int = 0
    # The next N successful writes are stored (and watchers told) but answered 500: the ambiguous
    # outcome of a timed-out write, which a careless controller turns into a duplicate create.
    fail_after_commit_next: int = 0
    # Answers to requests of these methods ("GET" for gets and lists) are held this long after the
    # server made them: a slow reply, which watch events of later changes overtake.
    answer_delay_seconds: float = 0.0
    answer_delay_methods: frozenset[str] = frozenset()


# -- versions and schemas ---------------------------------------------------------------------------


def _minor(version: str) -> int:
    """resource.k8s.io/v1, which the driver needs, is served from 1.34 on."""
    major, _, minor = version.partition(".")
    if major != "1" or not minor.isdigit() or int(minor) < 34:
        raise ValueError(f"Kubernetes version {version!r}: expected '1.N' with N >= 34")
    return int(minor)


def version_info(minor: int) -> dict[str, str]:
    """What GET /version answers; every field the client's VersionInfo model requires is there."""
    return {
        "major": "1",
        "minor": str(minor),
        "gitVersion": f"v1.{minor}.0",
        "gitCommit": "0" * 40,
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def schema_version(minor: int) -> str:
    """The kubernetes-validate schema objects are checked against: the server's own version where
    the package has it, else its newest (closest to a server newer than the package)."""
    available: list[str] = all_versions()
    wanted = f"1.{minor}.0"
    return wanted if wanted in available else available[-1]


def default_disabled_features(minor: int) -> frozenset[str]:
    """The gates of this version that are off by default (see _GATE_HISTORY); pass
    disabled_features to model a cluster where others are off."""
    return frozenset(
        gate
        for gate, (since, on_from) in _GATE_HISTORY.items()
        if since <= minor and (on_from is None or minor < on_from)
    )


def _known_gates(features: Iterable[str], minor: int | None = None) -> frozenset[str]:
    """A misspelt gate would silently drop nothing, so unknown names are refused; so is a gate the
    version does not have yet, as the real server refuses it at start."""
    gates = frozenset(features)
    if unknown := gates - FEATURE_GATES:
        raise ValueError(f"unknown feature gates {sorted(unknown)}; known: {sorted(FEATURE_GATES)}")
    if minor is not None and (later := sorted(g for g in gates if _GATE_HISTORY[g][0] > minor)):
        raise ValueError(f"feature gates {later} do not exist in Kubernetes 1.{minor}")
    return gates


# -- feature gates and defaults for ResourceSlices ---------------------------------------------------


def _dicts(value: object) -> list[Obj]:
    """The objects in a JSON list; anything malformed is left for schema validation to report."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _devices(spec: Obj) -> list[Obj]:
    return _dicts(spec.get("devices"))


def _drop_consumable_capacity(spec: Obj) -> None:
    for device in _devices(spec):
        device.pop("allowMultipleAllocations", None)
        capacity = device.get("capacity")
        for value in capacity.values() if isinstance(capacity, dict) else ():
            if isinstance(value, dict):
                value.pop("requestPolicy", None)


def _drop_partitionable_devices(spec: Obj) -> None:
    spec.pop("sharedCounters", None)
    spec.pop("perDeviceNodeSelection", None)
    for device in _devices(spec):
        for key in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
            device.pop(key, None)


def _drop_device_taints(spec: Obj) -> None:
    for device in _devices(spec):
        device.pop("taints", None)


def _drop_partition_type(spec: Obj) -> None:
    spec.pop("partitionTypeAttribute", None)


def _drop_extended_resource_name(spec: Obj) -> None:
    spec.pop("extendedResourceName", None)


def _drop_claim_device_status(status: Obj) -> None:
    status.pop("devices", None)


# What the real server drops from a ResourceSlice spec when a gate is off
# (pkg/registry/resource/resourceslice/strategy.go, dropDisabledFields).
_GATED_FIELDS: dict[str, Callable[[Obj], None]] = {
    "DRAConsumableCapacity": _drop_consumable_capacity,
    "DRAPartitionableDevices": _drop_partitionable_devices,
    "DRADeviceTaints": _drop_device_taints,
    "DRAPartitionableDevicesType": _drop_partition_type,
}
# The same for the other kinds, by (kind, the part of the object the fields are in):
# pkg/registry/resource/deviceclass and resourceclaim strategy.go, dropDisabledFields.
_GATED_FIELDS_OF_KIND: dict[tuple[str, str], dict[str, Callable[[Obj], None]]] = {
    ("DeviceClass", "spec"): {"DRAExtendedResource": _drop_extended_resource_name},
    ("ResourceClaim", "status"): {"DRAResourceClaimDeviceStatus": _drop_claim_device_status},
}


def _uses(drop: Callable[[Obj], None], spec: object) -> bool:
    """Whether a spec already uses a gated field: then an update keeps it, so that turning a gate
    off does not break objects written while it was on (the real server's rule)."""
    if not isinstance(spec, dict):
        return False
    trial = copy.deepcopy(spec)
    drop(trial)
    return trial != spec


def _drop_disabled_fields(
    obj: Obj,
    old: Obj | None,
    disabled: frozenset[str],
    fields: dict[str, Callable[[Obj], None]] = _GATED_FIELDS,
    part: str = "spec",
) -> None:
    spec = obj.get(part)
    if not isinstance(spec, dict):
        return
    for gate in sorted(disabled & fields.keys()):
        drop = fields[gate]
        if old is None or not _uses(drop, old.get(part)):
            drop(spec)


def _drop_disabled_fields_of_kind(kind: str, obj: Obj, old: Obj | None, disabled: frozenset[str]) -> None:
    for (gated_kind, part), fields in _GATED_FIELDS_OF_KIND.items():
        if gated_kind == kind:
            _drop_disabled_fields(obj, old, disabled, fields, part)


def _default_taint_times(obj: Obj) -> None:
    """The real server stamps taints without timeAdded (defaulting, RFC 3339 in whole seconds)."""
    spec = obj.get("spec")
    now = _now()
    for device in _devices(spec) if isinstance(spec, dict) else []:
        for taint in _dicts(device.get("taints")):
            if taint.get("timeAdded") is None:
                taint["timeAdded"] = now


# -- field selectors --------------------------------------------------------------------------------


def _field_value(obj: Obj, label: str) -> str:
    """A field as a selector sees it; a missing field reads as ""."""
    value: object = obj
    for key in _FIELD_PATHS.get(label, label).split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return "" if value is None else str(value)


@dataclass(frozen=True)
class _Requirement:
    label: str
    value: str
    equal: bool

    def matches(self, obj: Obj) -> bool:
        return (_field_value(obj, self.label) == self.value) == self.equal


# Checked at each position in this order, as k8s.io/apimachinery/pkg/fields does.
_OPERATORS = ("!=", "==", "=")


def _requirement(rtype: ResourceType, selector: str, term: str) -> _Requirement:
    for index in range(len(term)):
        for operator in _OPERATORS:
            if term.startswith(operator, index):
                label = term[:index]
                if label not in rtype.field_labels:
                    raise _bad_request(f"field label not supported: {label}")
                return _Requirement(label, term[index + len(operator) :], operator != "!=")
    raise _bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")


def _field_selector(rtype: ResourceType, selector: str) -> tuple[_Requirement, ...]:
    if "\\" in selector:
        raise _bad_request("escaped characters in field selectors are not supported by this stand-in")
    return tuple(_requirement(rtype, selector, term) for term in selector.split(",") if term)


# -- label selectors ---------------------------------------------------------------------------------


# An optional DNS-subdomain prefix and a name: what a label key may be.
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class _LabelRequirement:
    key: str
    value: str
    equal: bool

    def matches(self, obj: Obj) -> bool:
        labels = obj["metadata"].get("labels") or {}
        return (labels.get(self.key) == self.value) == self.equal


def _label_selector(selector: str) -> tuple[_LabelRequirement, ...]:
    """Equality-based terms (`k=v`, `k==v`, `k!=v`), as k8s.io/apimachinery/pkg/labels reads
    them; set-based and existence terms are refused, not ignored."""
    requirements = []
    for term in (part.strip() for part in selector.split(",")):
        operator = next((op for op in _OPERATORS if op in term), None)
        key, _, value = term.partition(operator) if operator else (term, "", "")
        if operator is None or not _LABEL_KEY.fullmatch(key):
            raise _bad_request(
                f"labelSelector term {term!r}: only key=value, key==value and key!=value are "
                "supported by this stand-in"
            )
        requirements.append(_LabelRequirement(key, value, operator != "!="))
    return tuple(requirements)


@dataclass(frozen=True)
class _Selection:
    """Which objects a list or watch is about: a namespace (None: all), field and label requirements."""

    namespace: str | None
    requirements: tuple[_Requirement, ...] = ()
    labels: tuple[_LabelRequirement, ...] = ()

    def matches(self, obj: Obj) -> bool:
        namespace = obj["metadata"].get("namespace", "")
        return (
            (self.namespace is None or namespace == self.namespace)
            and all(requirement.matches(obj) for requirement in self.requirements)
            and all(requirement.matches(obj) for requirement in self.labels)
        )


# -- watches ------------------------------------------------------------------------------------------


class _End(enum.Enum):
    """Queued after a watch's last event: how its stream ends."""

    CLOSE = "close"  # the response ends cleanly
    DROP = "drop"  # the connection is cut


_Item = Obj | _End


@dataclass(frozen=True)
class _Change:
    """One entry of the history. Stored objects are only ever replaced, never changed in place, so
    the history, the store and watch queues share them."""

    revision: int
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: Obj
    prev: Obj | None


@dataclass
class _History:
    changes: deque[_Change] = field(default_factory=deque)
    # Every change after this revision is still in `changes`.
    floor: int = 0


def _with_revision(obj: Obj, revision: int) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(revision)}}


def _expired(requested: int, floor: int) -> Obj:
    message = f"too old resource version: {requested} ({floor})"
    return {"type": "ERROR", "object": status_object(410, "Expired", message)}


@dataclass(eq=False)
class _Watch:
    rtype: ResourceType
    selection: _Selection
    # The revision of the last event sent (or the one the watch started from).
    revision: int = 0
    queue: asyncio.Queue[_Item] = field(default_factory=asyncio.Queue)

    def sees(self, change: _Change) -> Obj | None:
        """The event this watch gets for a change, if any. As in the real watch cache, an object
        that moves into the selection is ADDED and one that moves out is DELETED, with its previous
        content at the change's revision."""
        now = change.type != "DELETED" and self.selection.matches(change.obj)
        if change.prev is None or not self.selection.matches(change.prev):
            return {"type": "ADDED", "object": change.obj} if now else None
        if now:
            return {"type": "MODIFIED", "object": change.obj}
        return {"type": "DELETED", "object": _with_revision(change.prev, change.revision)}

    def sent(self, event: Obj) -> None:
        revision = event["object"].get("metadata", {}).get("resourceVersion")
        if revision:
            self.revision = int(revision)


async def _next_item(queue: asyncio.Queue[_Item], seconds: float) -> _Item | None:
    """The next queued item, or None when `seconds` pass without one."""
    if not queue.empty():
        return queue.get_nowait()
    if seconds <= 0:
        return None
    try:
        return await asyncio.wait_for(queue.get(), None if math.isinf(seconds) else seconds)
    except TimeoutError:
        return None


# -- the server ---------------------------------------------------------------------------------------


@dataclass
class Store:
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    # The last resourceVersion handed out: one counter for every type, like etcd's revision.
    revision: int = 1
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    succeeded: Counter[tuple[str, str]] = field(default_factory=Counter)
    history: dict[str, _History] = field(
        default_factory=lambda: {
            rtype.plural: _History() for rtype in (*RESOURCE_TYPES, *INSTALL_RESOURCE_TYPES)
        }
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _verb(request: web.Request) -> str:
    """The request's method, except that a watch is "WATCH": counts and faults tell them apart."""
    if request.method == "GET" and request.query.get("watch", "") in _TRUE:
        return "WATCH"
    return request.method


def _revision(text: str) -> int:
    if not text.isdigit():
        raise _bad_request(f"invalid resource version: {text!r}")
    return int(text)


def _timeout_seconds(request: web.Request) -> float:
    """timeoutSeconds of a watch; absent or 0 means no limit here (the real server picks one)."""
    text = request.query.get("timeoutSeconds", "") or "0"
    if not text.isdigit():
        raise _bad_request(f"invalid timeoutSeconds: {text!r}")
    return int(text) or math.inf


def _check_event(rtype: ResourceType, event: Obj) -> None:
    """The namespace rule of core/v1 Events without eventTime (legacyValidateEvent upstream)."""
    if event.get("eventTime"):
        return
    involved = event["involvedObject"].get("namespace") or ""
    # An event about a cluster-scoped object goes to "default" (or no namespace).
    allowed = (involved,) if involved else ("", "default")
    if event["metadata"].get("namespace", "") not in allowed:
        raise _invalid(
            rtype, f"involvedObject.namespace: Invalid value: {involved!r}: does not match event.namespace"
        )


def _check_partition_type(rtype: ResourceType, spec: Obj, attribute: object) -> None:
    """The slice-level rules of partitionTypeAttribute (KEP-5677, validatePartitionTypeAttribute):
    a fully qualified attribute name, only on a slice with counter-consuming devices, each of
    which carries that attribute as a string. The name is looked up as written and, within the
    driver's own domain, by its short form too, as the pool status controller resolves it."""
    field = "spec.partitionTypeAttribute"
    domain, _, short = str(attribute).rpartition("/")
    if not domain or dns_subdomain_problem(domain) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,31}", short):
        raise _invalid(
            rtype, f"{field}: Invalid value: {attribute!r}: must be a fully qualified attribute name"
        )
    consumers = [device for device in _devices(spec) if device.get("consumesCounters")]
    if not consumers:
        raise _invalid(
            rtype, f"{field}: Invalid value: {attribute!r}: no device of the slice consumes counters"
        )
    for device in consumers:
        attributes = device.get("attributes") or {}
        value = attributes.get(attribute, attributes.get(short) if domain == spec.get("driver") else None)
        if not isinstance(value, dict) or "string" not in value:
            raise _invalid(
                rtype,
                f"spec.devices[{device.get('name')}].attributes: Required value: {attribute!r} as a string "
                "(the slice's partitionTypeAttribute)",
            )


def _check_slice_update(rtype: ResourceType, spec: Obj, old: Obj) -> None:
    for path in ("driver", "nodeName", "pool.name"):
        if _field_value(spec, path) != _field_value(old, path):
            raise _invalid(
                rtype, f"spec.{path}: Invalid value: {_field_value(spec, path)!r}: field is immutable"
            )


class ApiServer:
    """The server of one Kubernetes version ("1.N", N >= 34): its /version, its schemas, and the
    feature gates it has off by default unless `disabled_features` names them."""

    def __init__(
        self,
        version: str = DEFAULT_VERSION,
        disabled_features: Iterable[str] | None = None,
        install_types: bool = False,
    ) -> None:
        self.version = version
        self.resource_types = (*RESOURCE_TYPES, *(INSTALL_RESOURCE_TYPES if install_types else ()))
        # Helm's release records as sent, by namespace and name (see _add_release_records).
        self.release_records: dict[str, dict[str, release_records.Record]] = {}
        self.minor = _minor(version)
        self.schema_version = schema_version(self.minor)
        self._disabled = (
            default_disabled_features(self.minor)
            if disabled_features is None
            else _known_gates(disabled_features, self.minor)
        )
        self.store = Store()
        self.faults = Faults()
        # The field manager that created each object by server-side apply (None: by another verb,
        # or no manager named); forgotten when anything else writes it (see _reapply).
        self._appliers: dict[tuple[str, str, str], str | None] = {}
        # How often a watch that allows bookmarks gets one.
        self.bookmark_interval_seconds = 1.0
        # Reentrant: fault counters are taken both with and without it held.
        self._lock = threading.RLock()
        self._watches: list[_Watch] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        # Counted when a request arrives, before injected latency: tests wait on it.
        self.requests_received = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)  # the official client asks with the slash
        self._add_discovery(app)
        if self.resource_types != RESOURCE_TYPES:
            self._add_release_records(app)
        for rtype in self.resource_types:
            prefix = f"/apis/{rtype.group}/{rtype.version}" if rtype.group else f"/api/{rtype.version}"
            collection = (
                f"{prefix}/namespaces/{{namespace}}/{rtype.plural}"
                if rtype.namespaced
                else f"{prefix}/{rtype.plural}"
            )
            if rtype.namespaced:  # list and watch across namespaces
                app.router.add_get(f"{prefix}/{rtype.plural}", self._handler(rtype, self._collection))
            app.router.add_get(collection, self._handler(rtype, self._collection))
            app.router.add_post(collection, self._handler(rtype, self._create))
            app.router.add_get(collection + "/{name}", self._handler(rtype, self._get))
            app.router.add_put(collection + "/{name}", self._handler(rtype, self._update))
            app.router.add_delete(collection + "/{name}", self._handler(rtype, self._delete))
            if rtype in INSTALL_RESOURCE_TYPES:
                app.router.add_patch(collection + "/{name}", self._handler(rtype, self._apply))
            if rtype.has_status:
                app.router.add_get(collection + "/{name}/status", self._handler(rtype, self._get))
                app.router.add_put(collection + "/{name}/status", self._handler(rtype, self._update_status))
        return app

    def _add_discovery(self, app: web.Application) -> None:
        """The legacy (unaggregated) discovery documents, which clients such as Helm's read to map
        a kind to its resource: /api, /apis and one resource list per group version. A client that
        asks for aggregated discovery gets these too, as from a server that predates it."""
        versions: dict[tuple[str, str], list[ResourceType]] = {}
        for rtype in self.resource_types:
            versions.setdefault((rtype.group, rtype.version), []).append(rtype)

        def answer(document: Obj) -> Callable[[web.Request], Awaitable[web.Response]]:
            async def respond(request: web.Request) -> web.Response:
                return web.json_response(document)

            return respond

        groups = sorted({group for group, _ in versions if group})
        app.router.add_get("/api", answer({"kind": "APIVersions", "versions": ["v1"]}))
        app.router.add_get(
            "/apis",
            answer(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_discovery_group(group, versions) for group in groups],
                }
            ),
        )
        for (group, version), rtypes in versions.items():
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            app.router.add_get(path, answer(_resource_list(group, version, rtypes)))

    def _add_release_records(self, app: web.Application) -> None:
        """Where Helm keeps its release records (Secrets, one per revision). Helm sends them as
        protobuf, which this stand-in does not decode: it keeps each body as sent
        (`release_records`, by namespace and name) and answers a get or a list (by labels, as
        Helm asks) with those bytes (tests/support/release_records.py). So Helm sees its earlier
        revisions, and upgrade, history and uninstall work. The records are Helm's own
        bookkeeping; the objects of a release are stored and validated like any other."""
        collection = "/api/v1/namespaces/{namespace}/secrets"

        def protobuf(body: bytes, status: int = 200) -> web.Response:
            return web.Response(body=body, status=status, content_type=release_records.MEDIA_TYPE)

        def not_found(name: str) -> ApiError:
            return ApiError(404, "NotFound", f'secrets "{name}" not found', {"name": name, "kind": "secrets"})

        async def received(request: web.Request) -> release_records.Record:
            try:
                record = release_records.parse_record(await request.read())
            except release_records.RecordError as error:
                raise ApiError(415, "UnsupportedMediaType", str(error)) from error
            if request.match_info.get("name", record.name) != record.name:
                raise _bad_request("the name of the object does not match the name on the URL")
            return record

        async def listed(request: web.Request) -> web.Response:
            wanted = (
                _label_selector(request.query["labelSelector"]) if request.query.get("labelSelector") else ()
            )
            with self._lock:
                records = self.release_records.get(request.match_info["namespace"], {})
                chosen = [
                    record
                    for _, record in sorted(records.items())
                    if all(term.matches({"metadata": {"labels": dict(record.labels)}}) for term in wanted)
                ]
            return protobuf(release_records.secret_list(chosen))

        async def got(request: web.Request) -> web.Response:
            name = request.match_info["name"]
            with self._lock:
                record = self.release_records.get(request.match_info["namespace"], {}).get(name)
            if record is None:
                raise not_found(name)
            return protobuf(record.body)

        async def created(request: web.Request) -> web.Response:
            record = await received(request)
            with self._lock:
                records = self.release_records.setdefault(request.match_info["namespace"], {})
                if record.name in records:
                    raise ApiError(
                        409, "AlreadyExists", f'secrets "{record.name}" already exists', {"name": record.name}
                    )
                records[record.name] = record
            return protobuf(record.body, status=201)

        async def replaced(request: web.Request) -> web.Response:
            record = await received(request)
            with self._lock:
                records = self.release_records.get(request.match_info["namespace"], {})
                if record.name not in records:
                    raise not_found(record.name)
                records[record.name] = record
            return protobuf(record.body)

        async def deleted(request: web.Request) -> web.Response:
            name = request.match_info["name"]
            with self._lock:
                record = self.release_records.get(request.match_info["namespace"], {}).pop(name, None)
            if record is None:
                raise not_found(name)
            return protobuf(record.body)

        app.router.add_get(collection, listed)
        app.router.add_post(collection, created)
        app.router.add_get(collection + "/{name}", got)
        app.router.add_put(collection + "/{name}", replaced)
        app.router.add_delete(collection + "/{name}", deleted)

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        # Handlers are cancelled when their client goes away, so that a watch whose client left
        # stops counting as open; a short shutdown timeout keeps stop() from hanging on one.
        self._runner = web.AppRunner(
            self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> ApiServer:
        """Serves from a background thread with its own event loop."""
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            loop.run_until_complete(self.serve())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="stand-in-apiserver", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _shutdown(self) -> None:
        self._end_watches(lambda watch: [_End.CLOSE])
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "tester"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- what tests read and turn ------------------------------------------------------------------

    def request_count(self, verb: str, plural: str) -> int:
        """Requests that reached a handler, by method ("WATCH" for watches) and resource."""
        with self._lock:
            return self.store.requests[(verb, plural)]

    def writes(self, plural: str) -> int:
        """Creates, updates and deletes of that resource answered with success (one that
        fail_after_commit_next answered 500 is stored, yet not counted)."""
        _resource_type(plural, self.resource_types)
        with self._lock:
            return sum(self.store.succeeded[(verb, plural)] for verb in _WRITE_VERBS)

    def reset_counts(self) -> None:
        """Starts request_count() and writes() from zero (requests_received goes on)."""
        with self._lock:
            self.store.requests.clear()
            self.store.succeeded.clear()

    def objects(self, plural: str) -> list[Obj]:
        """Copies of the stored objects of that resource, by name (then namespace)."""
        _resource_type(plural, self.resource_types)
        with self._lock:
            found = [copy.deepcopy(obj) for (kind, _, _), obj in self.store.objects.items() if kind == plural]
        return sorted(found, key=lambda obj: (obj["metadata"]["name"], obj["metadata"].get("namespace", "")))

    @property
    def disabled_features(self) -> frozenset[str]:
        with self._lock:
            return self._disabled

    def set_disabled_features(self, features: Iterable[str]) -> None:
        """Changes the gates at runtime, as a restart of the real server with other flags would."""
        gates = _known_gates(features, self.minor)
        with self._lock:
            self._disabled = gates

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    def compact(self) -> None:
        """Forgets the history up to now: watches from an older resourceVersion get 410 Expired."""
        with self._lock:
            for history in self.store.history.values():
                history.changes.clear()
                history.floor = self.store.revision

    def drop_watches(self) -> None:
        """Cuts the connection of every open watch, as a failing API server or proxy would."""
        self._end_watches(lambda watch: [_End.DROP])

    def expire_watches(self) -> None:
        """Compacts, then ends every open watch with the ERROR event that says 410 Expired."""
        with self._lock:
            self.compact()
            floor = self.store.revision
        self._end_watches(lambda watch: [_expired(watch.revision, floor), _End.CLOSE])

    def _end_watches(self, last_items: Callable[[_Watch], list[_Item]]) -> None:
        """Unregisters every watch at once (so open_watches is 0 on return) and queues its last
        items on the server's loop, which owns the queues."""
        with self._lock:
            watches, self._watches = self._watches, []
        if self._loop is None:
            return
        for watch in watches:
            for item in last_items(watch):
                self._loop.call_soon_threadsafe(watch.queue.put_nowait, item)

    def _take(self, counter: FaultCounter) -> bool:
        """Whether to inject that fault now, counting it down if so."""
        with self._lock:
            left: int = getattr(self.faults, counter)
            if left > 0:
                setattr(self.faults, counter, left - 1)
        return left > 0

    # -- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        with self._lock:
            self.requests_received += 1
        if self.faults.latency_seconds:
            await asyncio.sleep(self.faults.latency_seconds)
        warned: list[str] = []
        apiserver_rules.warnings.set(warned)
        apiserver_rules.field_validation.set(request.query.get("fieldValidation"))
        try:
            if self._injected_failure(_verb(request)):
                status = self.faults.fail_status
                raise ApiError(status, _REASONS.get(status, ""), "injected fault")
            response = await handler(request)
            for warning in warned:
                escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
                response.headers.add("Warning", f'299 - "{escaped}"')
            return response
        except ApiError as error:
            return error.response()
        except web.HTTPNotFound:
            return ApiError(404, "NotFound", "the server could not find the requested resource").response()
        except web.HTTPMethodNotAllowed:
            return ApiError(405, "MethodNotAllowed", "the server does not allow this method").response()

    def _injected_failure(self, verb: str) -> bool:
        methods = self.faults.fail_methods
        applies = verb != "WATCH" if methods is None else verb in methods
        return applies and self._take("fail_next")

    def _handler(
        self,
        rtype: ResourceType,
        method: Callable[[ResourceType, web.Request], Awaitable[web.StreamResponse]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            verb = _verb(request)
            with self._lock:
                self.store.requests[(verb, rtype.plural)] += 1
            try:
                response = await method(rtype, request)
                if verb in self.faults.answer_delay_methods:
                    await asyncio.sleep(self.faults.answer_delay_seconds)
                if verb in _WRITE_VERBS and self._take("fail_after_commit_next"):
                    raise ApiError(
                        500, "InternalError", "Internal error occurred: injected fault after commit"
                    )
            except ApiError as error:
                response = error.response()
            if response.status < 300:
                with self._lock:
                    self.store.succeeded[(verb, rtype.plural)] += 1
            return response

        return handle

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(version_info(self.minor))

    def _namespace(self, rtype: ResourceType, request: web.Request) -> str:
        namespace = request.match_info.get("namespace", "")
        if rtype.namespaced and (problem := dns_label_problem(namespace)):
            raise _bad_request(f"invalid namespace: {problem}")
        return namespace

    def _key(self, rtype: ResourceType, request: web.Request) -> tuple[str, str, str]:
        return rtype.plural, self._namespace(rtype, request), request.match_info["name"]

    def _not_found(self, rtype: ResourceType, name: str) -> ApiError:
        return ApiError(
            404,
            "NotFound",
            f'{rtype.group_resource} "{name}" not found',
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    def _stored(self, rtype: ResourceType, key: tuple[str, str, str]) -> Obj:
        obj = self.store.objects.get(key)
        if obj is None:
            raise self._not_found(rtype, key[2])
        return obj

    async def _json(self, request: web.Request) -> object:
        # Like the real server, a request without Content-Type is read as JSON (the official client
        # sends none on create).
        if "Content-Type" in request.headers and request.content_type != "application/json":
            raise ApiError(415, "UnsupportedMediaType", f"unsupported media type {request.content_type!r}")
        try:
            return json.loads(await request.read())
        except ValueError as error:
            raise _bad_request(f"invalid JSON: {error}") from error

    async def _body(self, rtype: ResourceType, request: web.Request) -> Obj:
        body = await self._json(request)
        if not isinstance(body, dict):
            raise _bad_request("the body must be a JSON object")
        for key, expected in (("apiVersion", rtype.api_version), ("kind", rtype.kind)):
            if body.setdefault(key, expected) != expected:
                raise _bad_request(f"{key} {body[key]!r} does not match {expected!r}")
        if not isinstance(body.setdefault("metadata", {}), dict):
            raise _bad_request("metadata must be an object")
        return body

    def _store(self, rtype: ResourceType, key: tuple[str, str, str], obj: Obj, prev: Obj | None) -> None:
        """Stores a new version of an object under a fresh resourceVersion, and tells watchers."""
        self.store.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.store.revision)
        self.store.objects[key] = obj
        self._record(rtype, _Change(self.store.revision, "ADDED" if prev is None else "MODIFIED", obj, prev))

    def _record(self, rtype: ResourceType, change: _Change) -> None:
        """Called with the lock held, on the server's loop (only handlers write)."""
        history = self.store.history[rtype.plural]
        history.changes.append(change)
        if len(history.changes) > HISTORY_LIMIT:
            history.floor = history.changes.popleft().revision
        for watch in self._watches:
            if watch.rtype is rtype and (event := watch.sees(change)) is not None:
                watch.queue.put_nowait(event)

    # -- validation ----------------------------------------------------------------------------------

    def _validate(self, rtype: ResourceType, obj: Obj) -> None:
        if not rtype.upstream_schema:
            return
        try:
            apiserver_rules.drop_unknown_fields(
                obj, self.schema_version, apiserver_rules.field_validation.get()
            )
            apiserver_rules.check_quantities(rtype.kind, obj)
        except apiserver_rules.DecodeError as error:
            raise _bad_request(str(error)) from error
        try:
            kubernetes_validate.validate(obj, self.schema_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            raise _invalid(rtype, f"{path}: {error.message}") from error
        if rtype.kind == "Event":
            _check_event(rtype, obj)
        if rtype.kind == "ResourceSlice":
            self._check_slice(rtype, obj["spec"])
        if rtype.kind in ("ResourceClaim", "ResourceClaimTemplate"):
            spec = obj.get("spec") or {}
            spec, where = (
                (spec.get("spec") or {}, "spec.spec")
                if rtype.kind == "ResourceClaimTemplate"
                else (spec, "spec")
            )
            try:
                apiserver_rules.check_claim_requests(spec.get("devices") or {}, f"{where}.devices")
            except apiserver_rules.InvalidField as error:
                raise _invalid(rtype, str(error)) from error

    def _check_slice(self, rtype: ResourceType, spec: Obj) -> None:
        """The rules of ValidateResourceSliceSpec that a driver can break with valid JSON."""
        chosen = [f"`{name}`" for name in _NODE_SELECTION if spec.get(name) is not None]
        if len(chosen) != 1:
            required = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
            raise _invalid(rtype, f"spec: Invalid value: {{{', '.join(chosen)}}}: {required} is required")
        if self.minor >= 35 and spec.get("devices") and spec.get("sharedCounters"):
            raise _invalid(
                rtype, "spec: Invalid value: only one of `devices` and `sharedCounters` may be set"
            )
        if (attribute := spec.get("partitionTypeAttribute")) is not None:
            _check_partition_type(rtype, spec, attribute)
        try:
            apiserver_rules.check_slice_devices(spec, self.minor)
        except apiserver_rules.InvalidField as error:
            raise _invalid(rtype, str(error)) from error

    # -- verbs ---------------------------------------------------------------------------------------

    async def _get(self, rtype: ResourceType, request: web.Request) -> web.Response:
        if _verb(request) == "WATCH":
            raise _bad_request(
                "watching one object by its path is not supported; use a metadata.name fieldSelector"
            )
        key = self._key(rtype, request)
        with self._lock:
            return web.json_response(self._stored(rtype, key))

    def _selection(self, rtype: ResourceType, request: web.Request) -> _Selection:
        namespace = self._namespace(rtype, request) if "namespace" in request.match_info else None
        labels = _label_selector(request.query["labelSelector"]) if request.query.get("labelSelector") else ()
        return _Selection(namespace, _field_selector(rtype, request.query.get("fieldSelector", "")), labels)

    def _selected(self, rtype: ResourceType, selection: _Selection) -> list[Obj]:
        return [
            obj
            for key, obj in sorted(self.store.objects.items(), key=lambda item: item[0])
            if key[0] == rtype.plural and selection.matches(obj)
        ]

    async def _collection(self, rtype: ResourceType, request: web.Request) -> web.StreamResponse:
        selection = self._selection(rtype, request)
        if _verb(request) == "WATCH":
            return await self._watch(rtype, request, selection)
        with self._lock:
            items = self._selected(rtype, selection)
            version = str(self.store.revision)
        return web.json_response(
            {
                "apiVersion": rtype.api_version,
                "kind": f"{rtype.kind}List",
                "metadata": {"resourceVersion": version},
                "items": items,
            }
        )

    def _choose_name(self, rtype: ResourceType, namespace: str, metadata: Obj) -> str:
        """The given name, else one made from generateName; called with the lock held."""
        name, prefix = metadata.get("name"), metadata.get("generateName")
        if isinstance(name, str) and name:
            if problem := dns_subdomain_problem(name):
                raise _invalid(rtype, f"metadata.name: {problem}")
            return name
        if not isinstance(prefix, str) or not prefix:
            raise _invalid(rtype, "metadata.name: Required value: name or generateName is required")
        generated = ""
        for _ in range(_NAME_ATTEMPTS):
            suffix = "".join(random.choices(_NAME_ALPHABET, k=_NAME_SUFFIX_LENGTH))
            generated = prefix[:_MAX_NAME_PREFIX] + suffix
            if (rtype.plural, namespace, generated) not in self.store.objects:
                break
        if problem := dns_subdomain_problem(generated):
            raise _invalid(rtype, f"metadata.generateName: {problem}")
        return generated

    def _prepare_create(self, rtype: ResourceType, body: Obj) -> None:
        """What the server sets or drops on create, before validation."""
        metadata = body["metadata"]
        if "resourceVersion" in metadata:
            raise _bad_request("resourceVersion should not be set on objects to be created")
        if rtype.has_status:
            body.pop("status", None)  # as the real server does: status is written through /status only
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = _now()
        if rtype.has_generation:
            metadata["generation"] = 1
        if rtype.kind == "ResourceSlice":
            _default_taint_times(body)
            _drop_disabled_fields(body, None, self.disabled_features)
        _drop_disabled_fields_of_kind(rtype.kind, body, None, self.disabled_features)

    async def _create(self, rtype: ResourceType, request: web.Request) -> web.Response:
        body = await self._body(rtype, request)
        namespace = self._namespace(rtype, request)
        metadata = body["metadata"]
        if rtype.namespaced and metadata.setdefault("namespace", namespace) != namespace:
            raise _bad_request("metadata.namespace does not match the request path")
        self._prepare_create(rtype, body)
        with self._lock:
            metadata["name"] = self._choose_name(rtype, namespace, metadata)
            self._validate(rtype, body)
            key = (rtype.plural, namespace, metadata["name"])
            if key in self.store.objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{rtype.group_resource} "{key[2]}" already exists',
                    {"name": key[2], "group": rtype.group, "kind": rtype.plural},
                )
            self._store(rtype, key, body, None)
        return web.json_response(body, status=201)

    def _replace(
        self,
        rtype: ResourceType,
        key: tuple[str, str, str],
        body: Obj,
        merge: Callable[[Obj, Obj], Obj],
    ) -> Obj:
        sent_name = body["metadata"].get("name")
        if sent_name not in (None, "", key[2]):
            raise _bad_request(
                f"the name of the object ({sent_name}) does not match the name on the URL ({key[2]})"
            )
        with self._lock:
            current = self._stored(rtype, key)
            sent_version = body["metadata"].get("resourceVersion")
            if self._take("conflict_next") or (
                sent_version and sent_version != current["metadata"]["resourceVersion"]
            ):
                raise _conflict(rtype, key[2], _MODIFIED)
            if body["metadata"].get("uid") not in (None, current["metadata"]["uid"]):
                raise ApiError(409, "Conflict", "metadata.uid does not match the stored object")
            updated = merge(copy.deepcopy(current), body)
            self._validate(rtype, updated)
            if rtype.kind == "ResourceSlice":
                _check_slice_update(rtype, updated["spec"], current["spec"])
            self._store(rtype, key, updated, current)
            return updated

    def _prepare_update(self, rtype: ResourceType, updated: Obj, current: Obj) -> None:
        """What the server sets or drops on update, in the real server's order: defaults, the
        generation (any spec change counts), then the fields of disabled gates."""
        if rtype.kind == "ResourceSlice":
            _default_taint_times(updated)
        if rtype.has_generation and updated.get("spec") != current.get("spec"):
            updated["metadata"]["generation"] = current["metadata"].get("generation", 0) + 1
        if rtype.kind == "ResourceSlice":
            _drop_disabled_fields(updated, current, self.disabled_features)
        _drop_disabled_fields_of_kind(rtype.kind, updated, current, self.disabled_features)

    async def _update(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        body = await self._body(rtype, request)

        def merge(current: Obj, sent: Obj) -> Obj:
            if rtype.immutable_spec and sent.get("spec") != current.get("spec"):
                raise _invalid(rtype, "spec: field is immutable")
            updated = dict(sent)
            if rtype.has_status:  # status is only written through /status
                updated.pop("status", None)
                if "status" in current:
                    updated["status"] = current["status"]
            kept = {k: v for k, v in current["metadata"].items() if k in _SERVER_OWNED_METADATA}
            updated["metadata"] = {**sent["metadata"], **kept}
            self._prepare_update(rtype, updated, current)
            return updated

        replaced = self._replace(rtype, key, body, merge)
        with self._lock:
            self._appliers.pop(key, None)  # a PUT takes over every field; no applier owns them now
        return web.json_response(replaced)

    async def _apply(self, rtype: ResourceType, request: web.Request) -> web.Response:
        """Server-side apply (Helm 4's default): an object that does not exist yet is created as a
        POST would; an existing one only by its sole applier (`_reapply`). Merging applies of
        several managers (field ownership) and the other patch types are refused, not
        approximated."""
        if request.content_type not in ("application/apply-patch+yaml", "application/apply-patch+json"):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"this stand-in takes only server-side apply patches, not {request.content_type!r}",
            )
        if request.query.get("dryRun"):
            raise _bad_request("dryRun is not supported by this stand-in API server")
        try:
            body = yaml.safe_load(await request.read())
        except yaml.YAMLError as error:
            raise _bad_request(f"invalid apply patch: {error}") from error
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise _bad_request("an apply patch is an object with metadata")
        for field_name, expected in (("apiVersion", rtype.api_version), ("kind", rtype.kind)):
            if body.get(field_name) != expected:
                raise _bad_request(f"{field_name} {body.get(field_name)!r} does not match {expected!r}")
        key = self._key(rtype, request)
        if body["metadata"].get("name") != key[2]:
            raise _bad_request("the name of the applied object does not match the name on the URL")
        if rtype.namespaced and body["metadata"].setdefault("namespace", key[1]) != key[1]:
            raise _bad_request("metadata.namespace does not match the request path")
        manager = request.query.get("fieldManager") or None
        with self._lock:
            if key in self.store.objects:
                return web.json_response(self._reapply(rtype, key, body, manager))
            self._prepare_create(rtype, body)
            self._validate(rtype, body)
            self._store(rtype, key, body, None)
            self._appliers[key] = manager
        return web.json_response(body, status=201)

    def _reapply(self, rtype: ResourceType, key: tuple[str, str, str], body: Obj, manager: str | None) -> Obj:
        """An apply to an object that the same field manager created by apply, and nobody else
        wrote since: that manager owns every field it set, so the applied configuration replaces
        them all (what it leaves out goes), and status and the server's metadata stay. That is
        what `helm upgrade` does to a release installed by server-side apply. Any other apply
        would need field ownership and is refused. Called with the lock held."""
        current = self.store.objects[key]
        if manager is None or self._appliers.get(key) != manager:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"server-side apply to the existing {rtype.kind} {key[2]!r} is supported here only "
                "for the field manager that created it by apply",
            )
        updated = {**body, "metadata": dict(body["metadata"])}
        updated.pop("status", None)
        if "status" in current:
            updated["status"] = current["status"]
        for name in _SERVER_OWNED_METADATA:
            if name in current["metadata"]:
                updated["metadata"][name] = current["metadata"][name]
        self._prepare_update(rtype, updated, current)
        unchanged = {**current, "metadata": {**current["metadata"], "resourceVersion": None}}
        if {**updated, "metadata": {**updated["metadata"], "resourceVersion": None}} == unchanged:
            return current  # as the real server does, a no-op apply writes nothing
        self._validate(rtype, updated)
        self._store(rtype, key, updated, current)
        return updated

    async def _update_status(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        body = await self._body(rtype, request)

        def merge(current: Obj, sent: Obj) -> Obj:
            old = copy.deepcopy(current)
            current["status"] = sent.get("status")
            if current["status"] is None:
                del current["status"]
            _drop_disabled_fields_of_kind(rtype.kind, current, old, self.disabled_features)
            return current

        return web.json_response(self._replace(rtype, key, body, merge))

    async def _preconditions(self, request: web.Request) -> Obj:
        """The preconditions of a DELETE's DeleteOptions body (which is optional)."""
        if not (await request.read()).strip():
            return {}
        options = await self._json(request)
        if not isinstance(options, dict) or options.get("kind", "DeleteOptions") != "DeleteOptions":
            raise _bad_request("the body of a DELETE must be DeleteOptions")
        if options.get("dryRun") or request.query.get("dryRun"):
            raise _bad_request("dryRun is not supported by this stand-in API server")
        preconditions = options.get("preconditions") or {}
        if not isinstance(preconditions, dict):
            raise _bad_request("preconditions must be an object")
        return preconditions

    def _check_preconditions(
        self, rtype: ResourceType, key: tuple[str, str, str], preconditions: Obj, current: Obj
    ) -> None:
        """With the real server's message, storage error and all."""
        storage_key = "/registry/" + "/".join(part for part in key if part)
        for field_name, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted, actual = preconditions.get(field_name), current["metadata"].get(field_name)
            if wanted is not None and wanted != actual:
                raise _conflict(
                    rtype,
                    key[2],
                    f"StorageError: invalid object, Code: 4, Key: {storage_key}, ResourceVersion: 0, "
                    f"AdditionalErrorMsg: Precondition failed: {label} in precondition: {wanted}, "
                    f"{label} in object meta: {actual}",
                )

    async def _delete(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        preconditions = await self._preconditions(request)
        with self._lock:
            current = self._stored(rtype, key)
            if self._take("conflict_next"):
                raise _conflict(rtype, key[2], _MODIFIED)
            self._check_preconditions(rtype, key, preconditions, current)
            del self.store.objects[key]
            self._appliers.pop(key, None)
            self.store.revision += 1
            # Like etcd, the deleted object comes back at the revision of its deletion.
            deleted = _with_revision(current, self.store.revision)
            self._record(rtype, _Change(self.store.revision, "DELETED", deleted, current))
        return web.json_response(deleted)

    # -- watch -----------------------------------------------------------------------------------------

    def _backlog(self, watch: _Watch, since: str) -> list[_Item]:
        """What a new watch gets first; called with the lock held. From resourceVersion "" or "0",
        the current objects as ADDED; from a later one, the history after it, or 410 Expired when
        that history is compacted away."""
        if since in ("", "0"):
            watch.revision = self.store.revision
            return [{"type": "ADDED", "object": obj} for obj in self._selected(watch.rtype, watch.selection)]
        watch.revision = _revision(since)
        history = self.store.history[watch.rtype.plural]
        if watch.revision < history.floor:
            return [_expired(watch.revision, history.floor), _End.CLOSE]
        changes = (change for change in history.changes if change.revision > watch.revision)
        return [event for change in changes if (event := watch.sees(change)) is not None]

    def _open_watch(self, rtype: ResourceType, selection: _Selection, since: str) -> _Watch:
        watch = _Watch(rtype, selection)
        with self._lock:
            for item in self._backlog(watch, since):
                watch.queue.put_nowait(item)
            self._watches.append(watch)
        return watch

    def _close_watch(self, watch: _Watch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)

    def _bookmark(self, rtype: ResourceType) -> Obj:
        with self._lock:
            revision = self.store.revision
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": rtype.kind,
                "apiVersion": rtype.api_version,
                "metadata": {"resourceVersion": str(revision)},
            },
        }

    async def _watch(
        self, rtype: ResourceType, request: web.Request, selection: _Selection
    ) -> web.StreamResponse:
        """A chunked 200 response of newline-delimited JSON events, as the real server streams."""
        duration = _timeout_seconds(request)
        bookmarks = request.query.get("allowWatchBookmarks", "") in _TRUE
        watch = self._open_watch(rtype, selection, request.query.get("resourceVersion", ""))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            end = await self._stream(watch, response, duration, bookmarks)
        finally:
            self._close_watch(watch)
        if end is _End.DROP and request.transport is not None:
            request.transport.abort()
        else:
            await response.write_eof()
        return response

    async def _stream(
        self, watch: _Watch, response: web.StreamResponse, duration: float, bookmarks: bool
    ) -> _End:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration
        interval = self.bookmark_interval_seconds if bookmarks else math.inf
        next_bookmark = loop.time() + interval
        while True:
            item = await _next_item(watch.queue, min(deadline, next_bookmark) - loop.time())
            if item is None:
                if loop.time() >= deadline:
                    return _End.CLOSE
                # A bookmark promises that every event up to its revision was sent: only when the
                # queue is empty does the current revision keep that promise.
                if loop.time() < next_bookmark or not watch.queue.empty():
                    continue
                item, next_bookmark = self._bookmark(watch.rtype), loop.time() + interval
            if isinstance(item, _End):
                return item
            await response.write(json.dumps(item).encode() + b"\n")
            watch.sent(item)


def _resource_type(plural: str, served: Iterable[ResourceType] = RESOURCE_TYPES) -> ResourceType:
    """Refuses a misspelt resource, which would otherwise read as an empty one."""
    served = tuple(served)
    for rtype in served:
        if rtype.plural == plural:
            return rtype
    raise ValueError(f"the stand-in serves no {plural!r}; it serves {[r.plural for r in served]}")


def _discovery_group(group: str, versions: dict[tuple[str, str], list[ResourceType]]) -> Obj:
    served = [
        {"groupVersion": f"{group}/{version}", "version": version} for g, version in versions if g == group
    ]
    return {"name": group, "versions": served, "preferredVersion": served[0]}


def _resource_list(group: str, version: str, rtypes: list[ResourceType]) -> Obj:
    verbs = ["create", "delete", "get", "list", "update", "watch"]
    resources: list[Obj] = []
    for rtype in rtypes:
        singular = rtype.kind.lower()
        resources.append(
            {
                "name": rtype.plural,
                "singularName": singular,
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": verbs,
            }
        )
        if rtype.has_status:
            resources.append(
                {
                    "name": f"{rtype.plural}/status",
                    "singularName": "",
                    "namespaced": rtype.namespaced,
                    "kind": rtype.kind,
                    "verbs": ["get", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", required=True, type=Path, help="written once the server listens")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="the Kubernetes version to be, as 1.N")
    args = parser.parse_args()

    async def run() -> None:
        server = ApiServer(version=args.version)
        await server.serve(port=args.port)
        server.write_kubeconfig(args.kubeconfig)
        print(server.url, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
