"""The JSON form of claim records, declared as Structs and decoded by `typed_decode.typed`.

Two layouts. Version 3 lists the record's side effects as tagged entries (`effects`). Version 2,
the layout of release 0.1.0, has one field per kind of side effect; it is still what a record is
written in whenever its effects fit it, so that a node can go back to 0.1.0 and keep its prepared
claims: only a record with an effect 0.1.0 does not know (a GPU bound to vfio-pci) is written in
version 3, which 0.1.0 sets aside as unreadable, naming the version (docs/operations.md,
"Upgrades and rollbacks"). Version 1 records (whole GPUs only, written once prepared) are read.
"""

from typing import Annotated, Any

import msgspec
from msgspec.structs import astuple

from dra_driver.base.strict_decode import DecodeError
from dra_driver.base.typed_decode import typed
from dra_driver.claims.effect_entries import (
    AnyEntry,
    ClaimMpsEntry,
    ComputeModeEntry,
    EffectEntry,
    GpuMpsEntry,
    MigInstanceEntry,
    TimeSliceEntry,
    disk_name,
)
from dra_driver.claims.identity import InvalidClaimIdentity, claim_ref
from dra_driver.claims.records import ClaimRecord, CorruptRecord, DeviceFacts, PreparedDevice, RecordState
from dra_driver.hardware.model import ComputeMode

RECORD_VERSION = 3
# The newest layout 0.1.0 reads, written while a record's effects fit it.
ROLLBACK_VERSION = 2
READABLE_VERSIONS = (1, 2, 3)

# The entries the version 2 layout has fields for.
_LAYOUT_2_KINDS = (MigInstanceEntry, TimeSliceEntry, ComputeModeEntry, ClaimMpsEntry, GpuMpsEntry)

_ENCODER = msgspec.json.Encoder()

_Count = Annotated[int, msgspec.Meta(ge=0)]


class _Wire(msgspec.Struct, frozen=True, omit_defaults=True, rename=disk_name):
    """The base of the layouts' parts: camel-case names, defaults left out."""


class _Claim(_Wire, frozen=True):
    namespace: str
    name: str
    uid: str


class _Facts(_Wire, frozen=True):
    type: str
    gpu_uuid: str
    gpu_index: _Count
    mig_profile: str | None = None
    mig_device_uuid: str | None = None
    admin_access: bool = False


class _Device(_Wire, frozen=True):
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    # Written always, null included: version 1 records did not write it, and held their device.
    exclusive_key: str | msgspec.UnsetType | None = msgspec.UNSET
    share_id: str | None = None
    memory_limit_bytes: _Count | None = None
    cores_limit: _Count | None = None
    facts: _Facts | None = None


class _Mig(_Wire, frozen=True):
    gpu_uuid: str
    profile_id: _Count
    placement_start: _Count
    placement_size: _Count


class _ComputeMode(_Wire, frozen=True):
    gpu_uuid: str
    restore: ComputeMode


class _Layout2(_Wire, frozen=True, omit_defaults=False):
    """Versions 1 and 2: one field per kind of side effect (each written, as 0.1.0 did)."""

    version: int
    claim: _Claim
    devices: tuple[_Device, ...]
    state: RecordState = "prepared"
    mig_instances: tuple[_Mig, ...] = ()
    time_sliced_gpus: tuple[str, ...] = ()
    mps: bool = False
    mps_gpus: tuple[str, ...] = ()
    compute_modes: tuple[_ComputeMode, ...] = ()
    reserved: tuple[str, ...] = ()
    generation: _Count | None = None


class _Layout3(_Wire, frozen=True, omit_defaults=False):
    """Version 3: the side effects as tagged entries."""

    version: int
    claim: _Claim
    devices: tuple[_Device, ...]
    state: RecordState = "prepared"
    effects: tuple[AnyEntry, ...] = ()
    reserved: tuple[str, ...] = ()
    generation: _Count | None = None


class _Version(msgspec.Struct):
    version: Any = None


def record_from_json(data: object) -> ClaimRecord:
    """Raises CorruptRecord, naming the field, for anything this code does not write."""
    try:
        version = typed(data, _Version).version
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise CorruptRecord(f"version: expected one of {READABLE_VERSIONS}, got {version!r}")
        if version == RECORD_VERSION:
            layout3 = typed(data, _Layout3)
            effects: tuple[EffectEntry, ...] = layout3.effects
            wire: _Layout2 | _Layout3 = layout3
        else:
            wire = layout2 = typed(data, _Layout2)
            effects = _entries_of(layout2)
        ref = claim_ref(wire.claim.namespace, wire.claim.name, wire.claim.uid)
    except (DecodeError, InvalidClaimIdentity) as error:
        raise CorruptRecord(str(error)) from error
    return ClaimRecord(
        claim=ref,
        devices=tuple(_device_of(device) for device in wire.devices),
        state=wire.state,
        effects=effects,
        reserved=wire.reserved,
        generation=wire.generation,
    )


def record_bytes(record: ClaimRecord) -> bytes:
    """The record file's bytes, as compact JSON (encoded from the Structs, on the prepare path)."""
    return _ENCODER.encode(_wire(record))


def record_to_json(record: ClaimRecord) -> dict[str, Any]:
    """The record as parsed JSON holds it."""
    built: dict[str, Any] = msgspec.to_builtins(_wire(record))
    return built


def _wire(record: ClaimRecord) -> "_Layout2 | _Layout3":
    """In version 2 while the record's effects fit it, else version 3 (see the module docstring)."""
    claim = _Claim(record.claim.namespace, record.claim.name, record.claim.uid)
    devices = tuple(_wire_device(device) for device in record.devices)
    wire: _Layout2 | _Layout3
    if all(isinstance(entry, _LAYOUT_2_KINDS) for entry in record.effects):
        wire = _Layout2(
            version=ROLLBACK_VERSION,
            claim=claim,
            devices=devices,
            state=record.state,
            mig_instances=tuple(
                _Mig(e.gpu_uuid, e.profile_id, e.placement_start, e.placement_size)
                for e in record.entries(MigInstanceEntry)
            ),
            time_sliced_gpus=tuple(e.gpu_uuid for e in record.entries(TimeSliceEntry)),
            mps=bool(record.entries(ClaimMpsEntry)),
            mps_gpus=tuple(e.gpu_uuid for e in record.entries(GpuMpsEntry)),
            compute_modes=tuple(
                _ComputeMode(e.gpu_uuid, e.restore) for e in record.entries(ComputeModeEntry)
            ),
            reserved=record.reserved,
            generation=record.generation,
        )
    else:
        wire = _Layout3(
            version=RECORD_VERSION,
            claim=claim,
            devices=devices,
            state=record.state,
            effects=record.effects,  # type: ignore[arg-type]  # every entry is one of AnyEntry
            reserved=record.reserved,
            generation=record.generation,
        )
    return wire


def _entries_of(wire: _Layout2) -> tuple[EffectEntry, ...]:
    """Version 2's fields as entries, in the order prepare makes them (MIG first, MPS last)."""
    return (
        *(
            MigInstanceEntry(m.gpu_uuid, m.profile_id, m.placement_start, m.placement_size)
            for m in wire.mig_instances
        ),
        *(TimeSliceEntry(gpu_uuid) for gpu_uuid in wire.time_sliced_gpus),
        *(ComputeModeEntry(c.gpu_uuid, c.restore) for c in wire.compute_modes),
        *((ClaimMpsEntry(),) if wire.mps else ()),
        *(GpuMpsEntry(gpu_uuid) for gpu_uuid in wire.mps_gpus),
    )


def _device_of(wire: _Device) -> PreparedDevice:
    """The record's device; the wire's fields are the model's, in the model's order."""
    fields = dict(zip(wire.__struct_fields__, astuple(wire), strict=True))
    # Version 1 records (whole GPUs) held their device exclusively and did not say so.
    if wire.exclusive_key is msgspec.UNSET:
        fields["exclusive_key"] = wire.device
    fields["facts"] = None if wire.facts is None else DeviceFacts(*astuple(wire.facts))
    return PreparedDevice(**fields)


def _wire_device(device: PreparedDevice) -> _Device:
    fields = dict(zip(device.__struct_fields__, astuple(device), strict=True))
    fields["facts"] = None if device.facts is None else _Facts(*astuple(device.facts))
    return _Device(**fields)
