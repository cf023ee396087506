"""Durable records of prepared claims: the agent's memory across restarts.

Unprepare arrives with only namespace/name/UID and the claim may already be gone from the API
server, so everything needed to undo a prepare is written here, durably, before kubelet is told
the claim is ready. One file per claim keeps writes small and independent.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import durable_files
from dra_driver.claims.identity import ClaimRef, InvalidClaimIdentity, claim_ref

RECORD_VERSION = 1
_SUFFIX = ".json"


class CorruptRecord(ValueError):
    """A record file that is not what this code writes."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "claim": {"namespace": self.claim.namespace, "name": self.claim.name, "uid": self.claim.uid},
            "devices": [
                {
                    "requestNames": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "cdiDeviceIds": list(d.cdi_device_ids),
                }
                for d in self.devices
            ],
        }


def _strings(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CorruptRecord(f"{path}: expected a list of strings")
    return tuple(value)


def _string(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise CorruptRecord(f"{path}.{key}: expected a string")
    return value


def record_from_json(data: object) -> ClaimRecord:
    if not isinstance(data, Mapping):
        raise CorruptRecord("expected an object")
    if data.get("version") != RECORD_VERSION:
        raise CorruptRecord(f"version: expected {RECORD_VERSION}, got {data.get('version')!r}")
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
            )
        )
    return ClaimRecord(claim=ref, devices=tuple(prepared))


@dataclass(frozen=True, slots=True)
class QuarantinedRecord:
    path: Path
    problem: str


class ClaimRecordStore:
    """Record files under <state-dir>/claims, named by claim UID (checked before it gets here)."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "claims"

    def _path(self, claim_uid: str) -> Path:
        return self.directory / f"{claim_uid}{_SUFFIX}"

    def load_all(self) -> tuple[dict[str, ClaimRecord], list[QuarantinedRecord]]:
        """Every readable record by UID; unreadable ones are renamed to *.corrupt and reported."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".*.tmp"):  # a write cut short by a crash
            leftover.unlink(missing_ok=True)
        records: dict[str, ClaimRecord] = {}
        quarantined = []
        for path in sorted(self.directory.glob(f"*{_SUFFIX}")):
            try:
                record = record_from_json(json.loads(path.read_bytes()))
                if path.name != f"{record.claim.uid}{_SUFFIX}":
                    raise CorruptRecord(f"file name does not match claim UID {record.claim.uid}")
            except (CorruptRecord, ValueError, UnicodeDecodeError) as error:
                aside = path.with_name(path.name + ".corrupt")
                path.rename(aside)
                quarantined.append(QuarantinedRecord(path=aside, problem=str(error)))
                continue
            records[record.claim.uid] = record
        return records, quarantined

    def save(self, record: ClaimRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps(record.to_json(), separators=(",", ":")).encode()
        durable_files.atomic_write(self._path(record.claim.uid), data, durable=True, mode=0o600)

    def delete(self, claim_uid: str) -> None:
        durable_files.remove(self._path(claim_uid), durable=True)
