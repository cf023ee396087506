"""A ResourceClaim (JSON from the API server) decoded once, into what this driver reads of it (pure).

The claim is input from outside the process: every field we rely on is type-checked here, and
each problem is refused (ClaimRejected) naming the JSON path of the field and what was expected,
so the kubelet event tells an operator exactly what is wrong. Prepare decodes the claim where it
fetches it; everything after reads the view, never the JSON. Only the results of this driver are
decoded: the others are the business of their drivers.

The part of the API object this driver reads is declared as Structs and decoded by
`typed_decode.typed`, in the wording every document of the driver shares. None of them refuses
unknown fields: the API adds fields with each version, and those are the API server's business.
A null counts as a field left out, as an API object's reader takes it (`_AN_OBJECT` and the other
descriptions keep "or null" out of what an operator is told was expected).

What is checked against the claim kubelet asked for (its UID, that it is allocated) and against
this node (pool, devices, the grant of a vGPU share) is not here: allocation.py and claim_plan.py.

The view is built on every prepare, so it holds no more than its readers take.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, get_args

import msgspec

from dra_driver.base.strict_decode import ByteQuantity, DecodeError, described, listed, shown
from dra_driver.base.typed_decode import typed
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
        try:
            wire = typed(claim, _Claim)
        except DecodeError as error:
            raise _rejected(error) from error
        allocation = wire.status.allocation if wire.status is not None else None
        devices = (allocation.devices if allocation is not None else None) or _Devices()
        pod_claim_name, problem = _pod_claim_name(wire.metadata.annotations)
        return cls(
            uid=wire.metadata.uid,
            generation=_generation(wire.metadata.generation),
            pod_claim_name=pod_claim_name,
            pod_claim_name_problem=problem,
            allocated=allocation is not None,
            results=_results(devices.results or (), driver_name),
            config=_config(devices.config or ()),
            json=claim,
        )


# --- The claim as the API server writes it, as far as this driver reads it ----------------------

# What a field holds when it is not null, as an operator is told it was expected.
_AN_OBJECT = msgspec.Meta(description="an object")
_A_LIST = msgspec.Meta(description="a list")
_A_STRING = msgspec.Meta(description="a string")
_SOURCES = f"one of {listed(get_args(ConfigSource))}"


class _Metadata(msgspec.Struct, frozen=True):
    uid: str
    # Read by hand: a generation that is no integer is left out, and a bad pod claim name is a
    # problem for a new prepare only (ResourceClaimView); neither refuses the claim.
    generation: Any = None
    annotations: Any = None


class _Head(msgspec.Struct, frozen=True):
    """Any driver's result, as far as this driver reads it: whose it is."""

    driver: str


class _Result(_Head, frozen=True, rename="camel"):
    """A result that names this driver."""

    request: str
    pool: str
    device: str
    admin_access: Annotated[bool | None, msgspec.Meta(description="true or false")] = None
    share_id: Annotated[str | None, _A_STRING] = msgspec.field(default=None, name="shareID")
    # Its quantities are checked by hand (`_device`): msgspec names an entry of a map `[...]`,
    # where an operator needs the capacity's name.
    consumed_capacity: Annotated[dict[str, Any] | None, _AN_OBJECT] = None


class _Opaque(msgspec.Struct, frozen=True):
    # Left out, it is told as null (`_config`): the wording config errors have always had.
    driver: Annotated[str | None, _A_STRING] = None
    # Decoded where it applies (opaque_config.effective_config), and only if it is this driver's.
    parameters: Any = None


class _Entry(msgspec.Struct, frozen=True):
    """Any config entry, as far as this driver reads one without `opaque`: that is the only kind
    of device configuration in resource.k8s.io/v1, and a future kind cannot name this driver's
    opaque parameters, so the rest of such an entry is the API's business."""


class _OpaqueEntry(_Entry, frozen=True):
    opaque: _Opaque
    source: Annotated[ConfigSource | None, msgspec.Meta(description=_SOURCES)] = None
    requests: Annotated[tuple[str, ...], msgspec.Meta(description="a list of request names")] = ()


class _Devices(msgspec.Struct, frozen=True):
    # Anyone's results: each is decoded as far as its driver says (`_results`).
    results: Annotated[list[Any] | None, _A_LIST] = None
    # Any kind of entry: each is decoded as far as its kind says (`_config`).
    config: Annotated[list[Any] | None, _A_LIST] = None


class _Allocation(msgspec.Struct, frozen=True):
    devices: Annotated[_Devices | None, _AN_OBJECT] = None


class _Status(msgspec.Struct, frozen=True):
    allocation: Annotated[_Allocation | None, _AN_OBJECT] = None


class _Claim(msgspec.Struct, frozen=True):
    metadata: _Metadata
    status: Annotated[_Status | None, _AN_OBJECT] = None


def _rejected(error: DecodeError) -> ClaimRejected:
    """typed's complaint in this module's words: a field left out "is missing" (a top-level one
    named as the claim's), and a config entry's problem is an OpaqueConfigError."""
    if error.problem.startswith("required"):
        where = error.path if "." in error.path else f"claim.{error.path}"
        message = f"{where} is missing"
    else:
        message = str(error)
    return (OpaqueConfigError if error.path.startswith(CONFIG) else ClaimRejected)(message)


def _generation(generation: object) -> int | None:
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else None


def _pod_claim_name(annotations: object) -> tuple[str | None, str | None]:
    """It becomes a path component in every container, so it must be what the API server allows
    for pod.spec.resourceClaims[].name."""
    if not isinstance(annotations, Mapping) or POD_CLAIM_NAME_ANNOTATION not in annotations:
        return None, None
    value = annotations[POD_CLAIM_NAME_ANNOTATION]
    path = f"metadata.annotations[{POD_CLAIM_NAME_ANNOTATION!r}]"
    if not isinstance(value, str):
        return None, f"{path}: expected a string, got {type(value).__name__}"
    if problem := k8s_names.dns_label_problem(value):
        return None, f"{path}: {problem}"
    return value, None


def _results(results: Sequence[Any], driver_name: str) -> tuple[AllocatedDevice, ...]:
    """This driver's results, decoded whole; anyone else's only as far as naming its driver, so
    that an odd field of theirs, or one a newer API adds for them, refuses nothing of ours."""
    ours = []
    for position, raw in enumerate(results):
        path = f"{RESULTS}[{position}]"
        try:
            if not (isinstance(raw, dict) and raw.get("driver") == driver_name):
                typed(raw, _Head, path)
                continue
            result = typed(raw, _Result, path)
        except DecodeError as error:
            raise _rejected(error) from error
        ours.append(_device(result, path, position))
    return tuple(ours)


def _device(result: _Result, path: str, position: int) -> AllocatedDevice:
    share_id = result.share_id
    if share_id is not None and not _SHARE_ID.fullmatch(share_id):
        raise ClaimRejected(f"{path}.shareID: expected a lowercase UUID, got {k8s_names.shown(share_id)}")
    consumed = result.consumed_capacity or {}
    for name, quantity in consumed.items():
        if not isinstance(quantity, str):
            raise ClaimRejected(
                f"{path}.consumedCapacity.{name}: expected a quantity string, got {described(quantity)}"
            )
    return AllocatedDevice(
        request=_request(result.request, path),
        pool=result.pool,
        device=result.device,
        admin_access=bool(result.admin_access),
        share_id=share_id,
        memory=_memory(consumed.get("memory"), f"{path}.consumedCapacity.memory"),
        cores=_cores(consumed.get("cores"), f"{path}.consumedCapacity.cores"),
        other_capacities=tuple(name for name in consumed if name not in ("memory", "cores")),
        position=position,
    )


def _request(request: str, path: str) -> str:
    """Request names end up in host and container paths (device_metadata): each part must be a
    DNS label, as the API server requires of request and subrequest names."""
    for part in request.split("/", 1):
        if problem := k8s_names.dns_label_problem(part):
            raise ClaimRejected(f"{path}.request: {problem}")
    return request


def _memory(written: str | None, path: str) -> Consumed | None:
    if written is None:
        return None
    try:
        return Consumed(int(ByteQuantity(written)), written)
    except ValueError as error:
        raise ClaimRejected(f"{path}: {error}") from error


def _cores(written: str | None, path: str) -> Consumed | None:
    """A percentage of the GPU's SMs, as vGPU devices publish their `cores` capacity."""
    if written is None:
        return None
    if not _WHOLE_NUMBER.fullmatch(written):
        raise ClaimRejected(f'{path}: {shown(written)} is not a whole percentage such as "50"')
    return Consumed(int(written), written)


def _config(entries: Sequence[Any]) -> tuple[ConfigEntry, ...]:
    """The opaque config entries, in order; their parameters are decoded where they apply
    (opaque_config.effective_config), and entries of another kind are skipped (`_Entry`)."""
    decoded = []
    for position, raw in enumerate(entries):
        where = f"{CONFIG}[{position}]"
        try:
            if not (isinstance(raw, dict) and raw.get("opaque") is not None):
                typed(raw, _Entry, where)
                continue
            entry = typed(raw, _OpaqueEntry, where)
        except DecodeError as error:
            raise _rejected(error) from error
        # Left out, a driver or source is told as null, as config errors always have.
        if entry.opaque.driver is None:
            raise OpaqueConfigError(f"{where}.opaque.driver: expected a string, got null")
        if entry.source is None:
            raise OpaqueConfigError(f"{where}.source: expected {_SOURCES}, got null")
        decoded.append(
            ConfigEntry(
                position=position,
                source=entry.source,
                requests=entry.requests,
                driver=entry.opaque.driver,
                parameters=entry.opaque.parameters,
            )
        )
    return tuple(decoded)
