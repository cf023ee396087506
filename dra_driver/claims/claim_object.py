"""A ResourceClaim (JSON from the API server) decoded once, into what this driver reads of it (pure).

The claim is input from outside the process: every field we rely on is type-checked here, and
each problem is refused (ClaimRejected) naming the JSON path of the field and what was expected,
so the kubelet event tells an operator exactly what is wrong. Prepare decodes the claim where it
fetches it; everything after reads the view, never the JSON. Only the results of this driver are
decoded: the others are the business of their drivers.

What is checked against the claim kubelet asked for (its UID, that it is allocated) and against
this node (pool, devices, the grant of a vGPU share) is not here: allocation.py and claim_plan.py.

The view is built on every prepare, so it holds no more than its readers take.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from dra_driver.base.strict_decode import (
    DecodeError,
    boolean,
    byte_quantity,
    choice,
    described,
    items,
    literal_options,
    mapping,
    shown,
    string,
)
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.opaque_config import ConfigEntry, ConfigSource, OpaqueConfigError
from dra_driver.kube import k8s_names

# Set by the resource claim controller on a claim made from a pod's template: the pod's name for it.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"

RESULTS = "status.allocation.devices.results"
CONFIG = "status.allocation.devices.config"

# What the API server writes in results[].shareID: a UUID in its canonical lowercase form.
_SHARE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


class Consumed(msgspec.Struct, frozen=True):
    """One consumed capacity: in the unit the driver counts it in, and as the result wrote it
    (messages quote what the user or the scheduler wrote, not our conversion of it)."""

    amount: int
    written: str


class AllocatedDevice(msgspec.Struct, frozen=True):
    """One allocation result that names this driver."""

    request: str
    pool: str
    device: str
    # Monitoring access (KEP-5018): no exclusivity and no side effects.
    admin_access: bool = False
    # Set for devices that allow multiple allocations: which share of the device this is.
    share_id: str | None = None
    # Capacity taken from a shareable device (consumable capacity): memory in bytes, cores in
    # percent of the GPU's SMs, and the names of any other capacity (a vGPU has none: refused).
    memory: Consumed | None = None
    cores: Consumed | None = None
    other_capacities: tuple[str, ...] = ()
    # Where the result sits in status.allocation.devices.results, for error messages.
    position: int = 0

    @property
    def path(self) -> str:
        return f"{RESULTS}[{self.position}]"

    @property
    def main_request(self) -> str:
        """Kubelet matches containers against the main request; firstAvailable adds '/<subrequest>'."""
        return self.request.split("/", 1)[0]

    @property
    def consumed_names(self) -> tuple[str, ...]:
        named = (("memory", self.memory), ("cores", self.cores))
        return (*(name for name, value in named if value is not None), *self.other_capacities)


class ResourceClaimView(msgspec.Struct, frozen=True):
    """What this driver reads of one ResourceClaim; `decode` is the one place that reads the JSON."""

    uid: str
    # metadata.generation, which the status conditions observe (None: the server sent none).
    generation: int | None
    # The pod's name for a claim made from a template (None: the pod names the claim itself), or
    # why the annotation cannot be one: a new prepare refuses it (device_metadata.pod_claim_name),
    # a prepared claim is not refused for an annotation edited since.
    pod_claim_name: str | None
    pod_claim_name_problem: str | None
    # Whether status.allocation is there at all.
    allocated: bool
    results: tuple[AllocatedDevice, ...]
    config: tuple[ConfigEntry, ...]
    # The claim as read, for the status write: a read-modify-write of the whole object.
    json: Mapping[str, Any]

    @classmethod
    def decode(cls, claim: object, driver_name: str) -> "ResourceClaimView":
        """The view of `claim` with the results that name `driver_name`; ClaimRejected (or its
        OpaqueConfigError, for a config entry) naming the first malformed field."""
        if not isinstance(claim, Mapping):
            raise ClaimRejected(f"the API server returned {described(claim)}, not a ResourceClaim object")
        metadata = _field(claim, "metadata", "claim", mapping)
        status = _field(claim, "status", "claim", mapping, required=False) or {}
        allocation = _field(status, "allocation", "status", mapping, required=False)
        devices = (
            _field(allocation, "devices", "status.allocation", mapping, required=False) or {}
            if allocation is not None
            else {}
        )
        pod_claim_name, problem = _pod_claim_name(metadata)
        return cls(
            uid=_field(metadata, "uid", "metadata", string),
            generation=_generation(metadata),
            pod_claim_name=pod_claim_name,
            pod_claim_name_problem=problem,
            allocated=allocation is not None,
            results=_results(devices, driver_name),
            config=_config(devices),
            json=claim,
        )


def _field(
    obj: Mapping[str, Any], key: str, path: str, decode: Callable[[Any, str], Any], required: bool = True
) -> Any:
    """A field of an API object; other fields are the API server's business, so no strictness there."""
    value = obj.get(key)
    if value is None:
        if required:
            raise ClaimRejected(f"{path}.{key} is missing")
        return None
    try:
        return decode(value, f"{path}.{key}")
    except DecodeError as error:
        raise ClaimRejected(str(error)) from error


def _generation(metadata: Mapping[str, Any]) -> int | None:
    generation = metadata.get("generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else None


def _pod_claim_name(metadata: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """It becomes a path component in every container, so it must be what the API server allows
    for pod.spec.resourceClaims[].name."""
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping) or POD_CLAIM_NAME_ANNOTATION not in annotations:
        return None, None
    value = annotations[POD_CLAIM_NAME_ANNOTATION]
    path = f"metadata.annotations[{POD_CLAIM_NAME_ANNOTATION!r}]"
    if not isinstance(value, str):
        return None, f"{path}: expected a string, got {type(value).__name__}"
    if problem := k8s_names.dns_label_problem(value):
        return None, f"{path}: {problem}"
    return value, None


def _results(devices: Mapping[str, Any], driver_name: str) -> tuple[AllocatedDevice, ...]:
    results = _field(devices, "results", "status.allocation.devices", items, required=False) or []
    ours = []
    for position, result in enumerate(results):
        path = f"{RESULTS}[{position}]"
        if not isinstance(result, Mapping):
            raise ClaimRejected(f"{path}: expected an object, got {described(result)}")
        if _field(result, "driver", path, string) != driver_name:
            continue
        share_id = _field(result, "shareID", path, string, required=False)
        if share_id is not None and not _SHARE_ID.fullmatch(share_id):
            raise ClaimRejected(f"{path}.shareID: expected a lowercase UUID, got {k8s_names.shown(share_id)}")
        consumed = _field(result, "consumedCapacity", path, mapping, required=False) or {}
        for name, quantity in consumed.items():
            if not isinstance(quantity, str):
                raise ClaimRejected(
                    f"{path}.consumedCapacity.{name}: expected a quantity string, got {described(quantity)}"
                )
        ours.append(
            AllocatedDevice(
                request=_request(result, path),
                pool=_field(result, "pool", path, string),
                device=_field(result, "device", path, string),
                admin_access=bool(_field(result, "adminAccess", path, boolean, required=False)),
                share_id=share_id,
                memory=_memory(consumed.get("memory"), f"{path}.consumedCapacity.memory"),
                cores=_cores(consumed.get("cores"), f"{path}.consumedCapacity.cores"),
                other_capacities=tuple(name for name in consumed if name not in ("memory", "cores")),
                position=position,
            )
        )
    return tuple(ours)


def _request(result: Mapping[str, Any], path: str) -> str:
    """Request names end up in host and container paths (device_metadata): each part must be a
    DNS label, as the API server requires of request and subrequest names."""
    request: str = _field(result, "request", path, string)
    for part in request.split("/", 1):
        if problem := k8s_names.dns_label_problem(part):
            raise ClaimRejected(f"{path}.request: {problem}")
    return request


def _memory(written: str | None, path: str) -> Consumed | None:
    if written is None:
        return None
    try:
        return Consumed(byte_quantity(written, path), written)
    except DecodeError as error:
        raise ClaimRejected(str(error)) from error


def _cores(written: str | None, path: str) -> Consumed | None:
    """A percentage of the GPU's SMs, as vGPU devices publish their `cores` capacity."""
    if written is None:
        return None
    if not _WHOLE_NUMBER.fullmatch(written):
        raise ClaimRejected(f'{path}: {shown(written)} is not a whole percentage such as "50"')
    return Consumed(int(written), written)


def _config(devices: Mapping[str, Any]) -> tuple[ConfigEntry, ...]:
    """The opaque config entries, in order; their parameters are decoded where they apply
    (opaque_config.effective_config). Entries without `opaque` are skipped: that is the only kind
    of device configuration in resource.k8s.io/v1, and any future kind cannot name this driver's
    opaque parameters."""
    raw_entries = devices.get("config")
    if raw_entries is None:
        return ()
    if not isinstance(raw_entries, list):
        raise OpaqueConfigError(f"{CONFIG}: expected a list, got {described(raw_entries)}")
    entries = []
    for position, raw in enumerate(raw_entries):
        where = f"{CONFIG}[{position}]"
        if not isinstance(raw, Mapping):
            raise OpaqueConfigError(f"{where}: expected an object, got {described(raw)}")
        opaque = raw.get("opaque")
        if opaque is None:
            continue
        if not isinstance(opaque, Mapping):
            raise OpaqueConfigError(f"{where}.opaque: expected an object, got {described(opaque)}")
        requests = raw.get("requests", [])
        if not isinstance(requests, list) or not all(isinstance(request, str) for request in requests):
            raise OpaqueConfigError(
                f"{where}.requests: expected a list of request names, got {described(requests)}"
            )
        driver = opaque.get("driver")
        if not isinstance(driver, str):
            raise OpaqueConfigError(f"{where}.opaque.driver: expected a string, got {described(driver)}")
        entries.append(
            ConfigEntry(
                position=position,
                source=_source(raw.get("source"), f"{where}.source"),
                requests=tuple(requests),
                driver=driver,
                parameters=opaque.get("parameters"),
            )
        )
    return tuple(entries)


def _source(value: object, path: str) -> ConfigSource:
    try:
        source: ConfigSource = choice(value, path, literal_options(ConfigSource))
    except DecodeError as error:
        raise OpaqueConfigError(f"{error.path or 'parameters'}: {error.problem}") from error
    return source
