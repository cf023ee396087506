"""What this driver reports in a ResourceClaim's `status.devices` (KEP-4817), and how its entries
join the list that other drivers write to as well (pure).

A workload or a tool reads a prepared device's facts from the claim without access to the node:
which GPU (UUID), the MIG device that prepare created for it, its profile, the vGPU limits, and
the CDI device IDs the containers got. Kubelet's answer carries none of that anywhere a user can
see it.

`status.devices` is a list-map keyed by driver, pool, device and shareID, shared by every driver
of the claim; entries are owned by their driver. So an update keeps every entry that is not ours
as it is, replaces ours by key, and keeps a condition's lastTransitionTime when its status did
not change (the API conventions' rule for conditions), which makes a repeated write of the same
facts a no-op rather than a change.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.records import ClaimRecord, MigInstanceRecord, PreparedDevice
from dra_driver.devices.origins import DynamicMig, StaticMig
from dra_driver.hardware.model import MigInstance

# AllocatedDeviceStatus.data: at most 10 Ki serialised (resource/v1 types.go); conditions <= 8.
MAX_DATA_BYTES = 10 * 1024
READY = "Ready"
PREPARED_REASON = "Prepared"
_MIB = 2**20

JsonObject = dict[str, Any]
# The MIG instances the prepare created (prepared.CreatedMig, which lives beside the I/O).
CreatedMig = Mapping[MigInstanceRecord, MigInstance]


@dataclass(frozen=True, slots=True)
class VgpuLimits:
    """What a vGPU share was granted (vgpu_edits.vgpu_share decides it, from the allocation)."""

    memory_bytes: int
    cores: int


@dataclass(frozen=True, slots=True)
class EntryKey:
    """The list-map key of `status.devices`: no two entries may share it."""

    driver: str
    pool: str
    device: str
    share_id: str | None


class StatusTooLarge(ValueError):
    """An entry's data would exceed what the API server stores."""


def entry_key(entry: Mapping[str, Any]) -> EntryKey:
    share_id = entry.get("shareID")
    return EntryKey(
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        share_id if isinstance(share_id, str) and share_id else None,
    )


def _device_data(
    planned: PlannedDevice, created: CreatedMig, prepared: PreparedDevice, vgpu: VgpuLimits | None
) -> JsonObject:
    data: JsonObject = {
        "type": planned.device.type,
        "gpuUUID": planned.gpu.uuid,
        "gpuIndex": planned.gpu.index,
    }
    origin = planned.origin
    if isinstance(origin, DynamicMig | StaticMig):
        data["migProfile"] = origin.profile.name
    instance = created.get(planned.create_mig) if planned.create_mig else planned.existing_mig
    if instance is not None:
        data["migDeviceUUID"] = instance.uuid
    if vgpu is not None:
        data["vgpu"] = {"memoryLimitMiB": vgpu.memory_bytes // _MIB, "coresLimitPercent": vgpu.cores}
    if planned.result.admin_access:
        data["adminAccess"] = True
    data["cdiDeviceIDs"] = list(prepared.cdi_device_ids)
    return data


def device_status_entries(
    driver_name: str,
    planned: Sequence[PlannedDevice],
    created: CreatedMig,
    record: ClaimRecord,
    *,
    now: str,
    generation: int | None,
    vgpu: Mapping[str, VgpuLimits] | None = None,
) -> tuple[JsonObject, ...]:
    """One entry per prepared device of ours, in the plan's order (the record's devices follow
    it). `now`: the RFC 3339 time the devices became ready; `generation`: the claim's
    metadata.generation, which the conditions observed (None: the server keeps none); `vgpu`:
    the limits of each vGPU share, by the planned device's CDI name."""
    entries = []
    for device, prepared in zip(planned, record.devices, strict=True):
        condition: JsonObject = {
            "type": READY,
            "status": "True",
            "reason": PREPARED_REASON,
            "message": f"prepared by the node agent on {prepared.pool}",
            "lastTransitionTime": now,
        }
        if generation is not None:
            condition["observedGeneration"] = generation
        data = _device_data(device, created, prepared, (vgpu or {}).get(device.cdi_name))
        size = len(json.dumps(data, separators=(",", ":")))
        if size > MAX_DATA_BYTES:
            raise StatusTooLarge(
                f"status.devices data of device {device.name}: {size} bytes, more than the "
                f"{MAX_DATA_BYTES} the API server stores"
            )
        entry: JsonObject = {"driver": driver_name, "pool": prepared.pool, "device": prepared.device}
        if prepared.share_id:
            entry["shareID"] = prepared.share_id
        entry["conditions"] = [condition]
        entry["data"] = data
        entries.append(entry)
    return tuple(entries)


def _with_kept_transition_times(ours: JsonObject, theirs: Mapping[str, Any] | None) -> JsonObject:
    """`ours` with the lastTransitionTime of each condition the stored entry already has with the
    same status: the condition did not transition, only its report was repeated."""
    if theirs is None or not isinstance(theirs.get("conditions"), list):
        return ours
    stored = {
        (c.get("type"), c.get("status")): c.get("lastTransitionTime")
        for c in theirs["conditions"]
        if isinstance(c, Mapping)
    }
    conditions = []
    for condition in ours.get("conditions", []):
        kept = stored.get((condition["type"], condition["status"]))
        conditions.append({**condition, "lastTransitionTime": kept} if isinstance(kept, str) else condition)
    return {**ours, "conditions": conditions}


def merged_devices(existing: object, ours: Sequence[JsonObject]) -> list[JsonObject]:
    """The `status.devices` list with our entries written into `existing`: entries with other keys
    stay where they are and as they are, ours replace the entry of their key or are appended."""
    current = [e for e in existing if isinstance(e, Mapping)] if isinstance(existing, list) else []
    by_key = {entry_key(entry): entry for entry in ours}
    merged: list[JsonObject] = []
    for entry in current:
        key = entry_key(entry)
        if key in by_key:
            merged.append(_with_kept_transition_times(by_key.pop(key), entry))
        else:
            merged.append(dict(entry))
    merged.extend(by_key.values())
    return merged


def allocated_keys(claim: Mapping[str, Any], driver_name: str) -> frozenset[EntryKey]:
    """The keys the claim's allocation gives `driver_name`: the API server refuses status for any
    other device, and drops entries of devices that are no longer allocated."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return frozenset()
    return frozenset(
        entry_key(result)
        for result in results
        if isinstance(result, Mapping) and result.get("driver") == driver_name
    )


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """What to do with a claim as read: `body` to PUT to its status subresource, or nothing, and
    why (`outcome`): "write", "unchanged" (already stored), "gone" (another claim now, or our
    devices no longer allocated to it)."""

    outcome: str
    body: JsonObject | None = None


def status_update(
    claim: object, claim_uid: str, driver_name: str, ours: Sequence[JsonObject]
) -> StatusUpdate:
    """The update that puts `ours` into `claim` (as read from the API server), keeping the
    resourceVersion read so that a concurrent writer makes it conflict instead of being lost."""
    if not isinstance(claim, Mapping):
        return StatusUpdate("gone")
    if not ours:
        return StatusUpdate("unchanged")
    metadata = claim.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("uid") != claim_uid:
        return StatusUpdate("gone")
    if not {entry_key(entry) for entry in ours} <= allocated_keys(claim, driver_name):
        return StatusUpdate("gone")
    status: Mapping[str, Any] = claim["status"]  # allocated_keys found our results in it
    existing = status.get("devices")
    merged = merged_devices(existing, ours)
    if merged == existing:
        return StatusUpdate("unchanged")
    return StatusUpdate("write", {**claim, "status": {**status, "devices": merged}})
