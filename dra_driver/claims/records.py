"""Records of prepared claims: the agent's memory across restarts, and their JSON form.

Unprepare arrives with only namespace/name/UID and the claim may already be gone from the API
server, so a record holds everything needed to undo a prepare. This module is the record and its
codec only, pure so that the claim planners can name the MIG instances a claim owns without
importing the disk layer; `record_store` keeps the records on disk.
"""

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.claims.identity import ClaimRef, InvalidClaimIdentity, claim_ref
from dra_driver.hardware.model import ComputeMode

# Version 2 added the prepare phase and the MIG instances a claim owns; version 1 records
# (whole GPUs only, written once prepared) are still read.
RECORD_VERSION = 2
READABLE_VERSIONS = (1, 2)

RecordState = Literal["preparing", "prepared"]


class CorruptRecord(OperatorFault, ValueError):
    """A record file that is not what this code writes."""


class DeviceFacts(msgspec.Struct, frozen=True):
    """What a prepared device is, as the claim's status.devices reports it (device_status).

    Kept in the record so that a status write lost to an agent restart is made again from the
    record alone, saying what prepare said: the hardware is not asked again, since by then it may
    answer differently (GPU indices move with a driver reload, a MIG device's UUID is known for
    sure only when it is created) or not at all (a GPU fallen off the bus)."""

    type: str
    gpu_uuid: str
    gpu_index: int
    mig_profile: str | None = None
    # The MIG device the claim uses: the one prepare created, or the static one it was given.
    mig_device_uuid: str | None = None
    admin_access: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "gpuUUID": self.gpu_uuid, "gpuIndex": self.gpu_index}
        if self.mig_profile is not None:
            data["migProfile"] = self.mig_profile
        if self.mig_device_uuid is not None:
            data["migDeviceUUID"] = self.mig_device_uuid
        if self.admin_access:
            data["adminAccess"] = True
        return data


class PreparedDevice(msgspec.Struct, frozen=True):
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    # What no other claim may hold meanwhile (None: admin access or an unnamed share).
    exclusive_key: str | None = None
    # The allocation result's shareID, for a share of a device that allows multiple allocations.
    share_id: str | None = None
    # A vGPU share's grant (memory bytes, SM percent): what usage metrics compare use against.
    memory_limit_bytes: int | None = None
    cores_limit: int | None = None
    # None in records written before the facts were kept: their claim's status is not rewritten.
    facts: DeviceFacts | None = None


class MigInstanceRecord(msgspec.Struct, frozen=True):
    """A MIG instance a claim creates: written before it is created, so a crash at any point
    leaves enough to find and destroy it (GPU, profile and placement identify it on the GPU)."""

    gpu_uuid: str
    profile_id: int
    placement_start: int
    placement_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuUUID": self.gpu_uuid,
            "profileId": self.profile_id,
            "placementStart": self.placement_start,
            "placementSize": self.placement_size,
        }


class ComputeModeRecord(msgspec.Struct, frozen=True):
    """A GPU whose compute mode an MPS claim set, and the mode it had before: written before the
    change, so that unprepare, and the rollback after a crash, put back what was there."""

    gpu_uuid: str
    restore: ComputeMode

    def to_json(self) -> dict[str, Any]:
        return {"gpuUUID": self.gpu_uuid, "restore": self.restore}


_COMPUTE_MODES: tuple[ComputeMode, ...] = ("Default", "ExclusiveThread", "Prohibited", "ExclusiveProcess")


class ClaimRecord(msgspec.Struct, frozen=True):
    """Two-phase: "preparing" is on disk before any side effect, "prepared" before kubelet hears
    of it, and "preparing" again before unprepare undoes side effects. A "preparing" record found
    at start is a prepare or unprepare cut short; its side effects are rolled back."""

    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
    state: RecordState = "prepared"
    mig_instances: tuple[MigInstanceRecord, ...] = ()
    # GPUs whose time slice the claim changed (set back to Default when it goes).
    time_sliced_gpus: tuple[str, ...] = ()
    # Whether the claim has an MPS control daemon (found by claim UID under the MPS directory).
    mps: bool = False
    # GPUs whose MPS daemon (one per GPU, shared by its vGPU shares under vgpu.enforcement mps)
    # the claim's share goes through: written before the daemon is started, so that the last
    # claim on a GPU to go, or the rollback after a crash, stops it.
    mps_gpus: tuple[str, ...] = ()
    # Whole GPUs set to ExclusiveProcess for the claim's MPS daemon, with the mode to restore.
    compute_modes: tuple[ComputeModeRecord, ...] = ()
    # While preparing: the exclusive devices the claim has taken (also in the shared reservation
    # table), kept here too so that a crash that leaves this record leaves them taken until the
    # record is rolled back.
    reserved: tuple[str, ...] = ()
    # The claim's metadata.generation that prepare read: what its status conditions observed.
    generation: int | None = None

    @property
    def has_side_effects(self) -> bool:
        return bool(
            self.mig_instances or self.time_sliced_gpus or self.mps or self.compute_modes or self.mps_gpus
        )

    @property
    def exclusive_keys(self) -> tuple[str, ...]:
        return self.reserved + tuple(d.exclusive_key for d in self.devices if d.exclusive_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "state": self.state,
            "migInstances": [instance.to_json() for instance in self.mig_instances],
            "timeSlicedGPUs": list(self.time_sliced_gpus),
            "mps": self.mps,
            **({"mpsGPUs": list(self.mps_gpus)} if self.mps_gpus else {}),
            "computeModes": [entry.to_json() for entry in self.compute_modes],
            "reservedDevices": list(self.reserved),
            "claim": {"namespace": self.claim.namespace, "name": self.claim.name, "uid": self.claim.uid},
            "devices": [
                {
                    "requestNames": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "cdiDeviceIds": list(d.cdi_device_ids),
                    "exclusiveKey": d.exclusive_key,
                    "shareID": d.share_id,
                    **_limits_json(d),
                    **({} if d.facts is None else {"facts": d.facts.to_json()}),
                }
                for d in self.devices
            ],
            **({} if self.generation is None else {"claimGeneration": self.generation}),
        }


def _limits_json(device: PreparedDevice) -> dict[str, int]:
    """Written only for vGPU shares, so records of other devices read as they always did."""
    limits = {}
    if device.memory_limit_bytes is not None:
        limits["memoryLimitBytes"] = device.memory_limit_bytes
    if device.cores_limit is not None:
        limits["coresLimit"] = device.cores_limit
    return limits


def _optional_integer(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    return None if obj.get(key) is None else _integer(obj, key, path)


def _strings(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CorruptRecord(f"{path}: expected a list of strings")
    return tuple(value)


def _string(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise CorruptRecord(f"{path}.{key}: expected a string")
    return value


def _integer(obj: Mapping[str, Any], key: str, path: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CorruptRecord(f"{path}.{key}: expected a non-negative integer")
    return value


def _facts(device: Mapping[str, Any], path: str) -> DeviceFacts | None:
    """Absent from records written before the facts were kept (read as None)."""
    raw = device.get("facts")
    if raw is None:
        return None
    path = f"{path}.facts"
    if not isinstance(raw, Mapping):
        raise CorruptRecord(f"{path}: expected an object")
    admin_access = raw.get("adminAccess", False)
    if not isinstance(admin_access, bool):
        raise CorruptRecord(f"{path}.adminAccess: expected true or false")
    return DeviceFacts(
        type=_string(raw, "type", path),
        gpu_uuid=_string(raw, "gpuUUID", path),
        gpu_index=_integer(raw, "gpuIndex", path),
        mig_profile=_optional_string(raw, "migProfile", path),
        mig_device_uuid=_optional_string(raw, "migDeviceUUID", path),
        admin_access=admin_access,
    )


def _mig_instances(data: Mapping[str, Any]) -> tuple[MigInstanceRecord, ...]:
    raw = data.get("migInstances", [])
    if not isinstance(raw, list):
        raise CorruptRecord("migInstances: expected a list")
    instances = []
    for position, entry in enumerate(raw):
        path = f"migInstances[{position}]"
        if not isinstance(entry, Mapping):
            raise CorruptRecord(f"{path}: expected an object")
        instances.append(
            MigInstanceRecord(
                gpu_uuid=_string(entry, "gpuUUID", path),
                profile_id=_integer(entry, "profileId", path),
                placement_start=_integer(entry, "placementStart", path),
                placement_size=_integer(entry, "placementSize", path),
            )
        )
    return tuple(instances)


def _compute_modes(data: Mapping[str, Any]) -> tuple[ComputeModeRecord, ...]:
    raw = data.get("computeModes", [])
    if not isinstance(raw, list):
        raise CorruptRecord("computeModes: expected a list")
    entries = []
    for position, entry in enumerate(raw):
        path = f"computeModes[{position}]"
        if not isinstance(entry, Mapping):
            raise CorruptRecord(f"{path}: expected an object")
        restore = entry.get("restore")
        mode = next((mode for mode in _COMPUTE_MODES if mode == restore), None)
        if mode is None:
            raise CorruptRecord(f"{path}.restore: expected one of {', '.join(_COMPUTE_MODES)}")
        entries.append(ComputeModeRecord(_string(entry, "gpuUUID", path), mode))
    return tuple(entries)


def _optional_string(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise CorruptRecord(f"{path}.{key}: expected a string or null")
    return value


def _exclusive_key(device: Mapping[str, Any], path: str) -> str | None:
    """Version 1 records (whole GPUs) held their device exclusively and did not say so."""
    if "exclusiveKey" not in device:
        return _string(device, "device", path)
    key = device["exclusiveKey"]
    if key is not None and not isinstance(key, str):
        raise CorruptRecord(f"{path}.exclusiveKey: expected a string or null")
    return key


def _generation(data: Mapping[str, Any]) -> int | None:
    """Absent from records written before it was kept, and where the server keeps none."""
    value = data.get("claimGeneration")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise CorruptRecord("claimGeneration: expected a non-negative integer")
    return value


def _state(data: Mapping[str, Any]) -> RecordState:
    state = data.get("state", "prepared")
    if state == "preparing":
        return "preparing"
    if state == "prepared":
        return "prepared"
    raise CorruptRecord(f"state: expected preparing or prepared, got {state!r}")


def record_from_json(data: object) -> ClaimRecord:
    if not isinstance(data, Mapping):
        raise CorruptRecord("expected an object")
    if data.get("version") not in READABLE_VERSIONS:
        raise CorruptRecord(f"version: expected one of {READABLE_VERSIONS}, got {data.get('version')!r}")
    claim = data.get("claim")
    devices = data.get("devices")
    if not isinstance(claim, Mapping):
        raise CorruptRecord("claim: expected an object")
    if not isinstance(devices, list):
        raise CorruptRecord("devices: expected a list")
    try:
        ref = claim_ref(
            _string(claim, "namespace", "claim"),
            _string(claim, "name", "claim"),
            _string(claim, "uid", "claim"),
        )
    except InvalidClaimIdentity as error:
        raise CorruptRecord(str(error)) from error
    prepared = []
    for position, device in enumerate(devices):
        path = f"devices[{position}]"
        if not isinstance(device, Mapping):
            raise CorruptRecord(f"{path}: expected an object")
        prepared.append(
            PreparedDevice(
                request_names=_strings(device.get("requestNames"), f"{path}.requestNames"),
                pool=_string(device, "pool", path),
                device=_string(device, "device", path),
                cdi_device_ids=_strings(device.get("cdiDeviceIds"), f"{path}.cdiDeviceIds"),
                exclusive_key=_exclusive_key(device, path),
                share_id=_optional_string(device, "shareID", path),
                memory_limit_bytes=_optional_integer(device, "memoryLimitBytes", path),
                cores_limit=_optional_integer(device, "coresLimit", path),
                facts=_facts(device, path),
            )
        )
    mps = data.get("mps", False)
    if not isinstance(mps, bool):
        raise CorruptRecord("mps: expected true or false")
    return ClaimRecord(
        claim=ref,
        devices=tuple(prepared),
        state=_state(data),
        mig_instances=_mig_instances(data),
        time_sliced_gpus=_strings(data.get("timeSlicedGPUs", []), "timeSlicedGPUs"),
        mps=mps,
        mps_gpus=_strings(data.get("mpsGPUs", []), "mpsGPUs"),
        compute_modes=_compute_modes(data),
        reserved=_strings(data.get("reservedDevices", []), "reservedDevices"),
        generation=_generation(data),
    )
