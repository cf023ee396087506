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

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from dra_driver.base.compact_json import compact_json
from dra_driver.base.errors import ClaimFault
from dra_driver.base.json_object import JsonObject
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.records import ClaimRecord, DeviceFacts, PreparedDevice

# AllocatedDeviceStatus.data: at most 10 Ki serialised (resource/v1 types.go); conditions <= 8.
MAX_DATA_BYTES = 10 * 1024
READY = "Ready"
PREPARED_REASON = "Prepared"
_MIB = 2**20


class EntryKey(msgspec.Struct, frozen=True):
    """The list-map key of `status.devices`: no two entries may share it."""

    driver: str
    pool: str
    device: str
    share_id: str | None


class StatusTooLarge(ClaimFault, ValueError):
    """An entry's data would exceed what the API server stores."""


def entry_key(entry: Mapping[str, Any]) -> EntryKey:
    share_id = entry.get("shareID")
    return EntryKey(
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        share_id if isinstance(share_id, str) and share_id else None,
    )


def has_status_facts(record: ClaimRecord) -> bool:
    """Whether the record keeps what the entries say (records.DeviceFacts): older ones do not."""
    return all(device.facts is not None for device in record.devices)


def _device_data(facts: DeviceFacts, prepared: PreparedDevice) -> JsonObject:
    """The entry's `data`, built here rather than by the record's codec: what the status says may
    change without changing what records on disk say, and the other way round."""
    data: JsonObject = {"type": facts.type, "gpuUUID": facts.gpu_uuid, "gpuIndex": facts.gpu_index}
    if facts.mig_profile is not None:
        data["migProfile"] = facts.mig_profile
    if facts.mig_device_uuid is not None:
        data["migDeviceUUID"] = facts.mig_device_uuid
    if facts.admin_access:
        data["adminAccess"] = True
    if prepared.memory_limit_bytes is not None and prepared.cores_limit is not None:
        data["vgpu"] = {
            "memoryLimitMiB": prepared.memory_limit_bytes // _MIB,
            "coresLimitPercent": prepared.cores_limit,
        }
    data["cdiDeviceIDs"] = list(prepared.cdi_device_ids)
    return data


def device_status_entries(driver_name: str, record: ClaimRecord, *, now: str) -> tuple[JsonObject, ...]:
    """One entry per prepared device of ours, in the record's order, from the record alone: the
    entries written right after prepare and those written again after a restart are the same.
    `now`: the RFC 3339 time the devices became ready. The conditions observed the claim's
    generation that prepare read (none where the server keeps none). A record without the
    devices' facts (`has_status_facts`) is a ValueError."""
    entries = []
    for prepared in record.devices:
        if prepared.facts is None:
            raise ValueError(f"the record of device {prepared.device} does not keep its facts")
        condition: JsonObject = {
            "type": READY,
            "status": "True",
            "reason": PREPARED_REASON,
            "message": f"prepared by the node agent on {prepared.pool}",
            "lastTransitionTime": now,
        }
        if record.generation is not None:
            condition["observedGeneration"] = record.generation
        data = _device_data(prepared.facts, prepared)
        size = len(compact_json(data))
        if size > MAX_DATA_BYTES:
            raise StatusTooLarge(
                f"status.devices data of device {prepared.device}: {size} bytes, more than the "
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


def allocated_keys(claim: ResourceClaimView, driver_name: str) -> frozenset[EntryKey]:
    """The keys the claim's allocation gives `driver_name` (the driver the view was decoded for):
    the API server refuses status for any other device, and drops entries of devices that are no
    longer allocated."""
    return frozenset(EntryKey(driver_name, r.pool, r.device, r.share_id) for r in claim.results)


class StatusUpdate(msgspec.Struct, frozen=True):
    """What to do with a claim as read: `body` to PUT to its status subresource, or nothing, and
    why (`outcome`): "write", "unchanged" (already stored), "gone" (another claim now, or our
    devices no longer allocated to it)."""

    outcome: str
    body: JsonObject | None = None


def status_update(
    claim: ResourceClaimView, claim_uid: str, driver_name: str, ours: Sequence[JsonObject]
) -> StatusUpdate:
    """The update that puts `ours` into `claim` (as read from the API server), keeping the
    resourceVersion read so that a concurrent writer makes it conflict instead of being lost."""
    if not ours:
        return StatusUpdate("unchanged")
    if claim.uid != claim_uid:
        return StatusUpdate("gone")
    if not {entry_key(entry) for entry in ours} <= allocated_keys(claim, driver_name):
        return StatusUpdate("gone")
    status: Mapping[str, Any] = claim.json["status"]  # allocated_keys found our results in it
    existing = status.get("devices")
    merged = merged_devices(existing, ours)
    if merged == existing:
        return StatusUpdate("unchanged")
    return StatusUpdate("write", {**claim.json, "status": {**status, "devices": merged}})
