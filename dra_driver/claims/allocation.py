"""Reading a ResourceClaim object (JSON from the API server) into what this driver must prepare.

The claim is input from outside the process: every field we rely on is type-checked and each
problem is reported with the JSON path of the field, so the kubelet event tells an operator
exactly what is wrong.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dra_driver.claims.identity import ClaimRef
from dra_driver.config.strict_decode import DecodeError, boolean, described, items, mapping, string
from dra_driver.kube.k8s_names import shown
from dra_driver.observability.error_reasons import ErrorReason


class ClaimRejected(Exception):
    """This claim cannot be prepared; the message goes back to kubelet as the claim's error."""

    metric_reason: ClassVar[ErrorReason] = "claim_rejected"


# What the API server writes in results[].shareID: a UUID in its canonical lowercase form.
_SHARE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result that names this driver."""

    request: str
    pool: str
    device: str
    # Monitoring access (KEP-5018): no exclusivity and no side effects.
    admin_access: bool = False
    # Set for devices that allow multiple allocations: which share of the device this is.
    share_id: str | None = None
    # Capacity taken from a shareable device, as quantities (consumable capacity).
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    # Where the result sits in status.allocation.devices.results, for error messages.
    position: int = 0

    @property
    def path(self) -> str:
        return f"status.allocation.devices.results[{self.position}]"

    @property
    def main_request(self) -> str:
        """Kubelet matches containers against the main request; firstAvailable adds '/<subrequest>'."""
        return self.request.split("/", 1)[0]


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


def allocated_devices(claim: object, ref: ClaimRef, driver_name: str) -> tuple[AllocatedDevice, ...]:
    """The results of `claim` that belong to `driver_name`, after checking it is the claim kubelet meant."""
    if not isinstance(claim, Mapping):
        raise ClaimRejected(f"claim {ref}: the API server returned {type(claim).__name__}, not an object")
    metadata = _field(claim, "metadata", "claim", mapping)
    uid = _field(metadata, "uid", "metadata", string)
    if uid != ref.uid:
        raise ClaimRejected(
            f"claim {ref.namespace}/{ref.name} now has UID {shown(uid)}, kubelet asked for {ref.uid}: "
            "the claim was deleted and re-created"
        )
    status = _field(claim, "status", "claim", mapping, required=False) or {}
    allocation = _field(status, "allocation", "status", mapping, required=False)
    if allocation is None:
        raise ClaimRejected(f"claim {ref} is not allocated (status.allocation is missing)")
    devices = _field(allocation, "devices", "status.allocation", mapping, required=False) or {}
    results = _field(devices, "results", "status.allocation.devices", items, required=False) or []
    ours = []
    for position, result in enumerate(results):
        path = f"status.allocation.devices.results[{position}]"
        if not isinstance(result, Mapping):
            raise ClaimRejected(f"{path}: expected an object, got {described(result)}")
        if _field(result, "driver", path, string) != driver_name:
            continue
        share_id = _field(result, "shareID", path, string, required=False)
        if share_id is not None and not _SHARE_ID.fullmatch(share_id):
            raise ClaimRejected(f"{path}.shareID: expected a lowercase UUID, got {shown(share_id)}")
        ours.append(
            AllocatedDevice(
                request=_field(result, "request", path, string),
                pool=_field(result, "pool", path, string),
                device=_field(result, "device", path, string),
                admin_access=bool(_field(result, "adminAccess", path, boolean, required=False)),
                share_id=share_id,
                consumed_capacity=_consumed_capacity(result, path),
                position=position,
            )
        )
    return tuple(ours)


def _consumed_capacity(result: Mapping[str, Any], path: str) -> dict[str, str]:
    consumed = _field(result, "consumedCapacity", path, mapping, required=False) or {}
    for name, quantity in consumed.items():
        if not isinstance(quantity, str):
            raise ClaimRejected(
                f"{path}.consumedCapacity.{name}: expected a quantity string, got {described(quantity)}"
            )
    return dict(consumed)
