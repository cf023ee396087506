"""Records of prepared claims: the agent's memory across restarts.

Unprepare arrives with only namespace/name/UID and the claim may already be gone from the API
server, so a record holds everything needed to undo a prepare: the devices and the side effects,
each side effect one tagged entry (`effect_entries`), so that the record has no field per kind of
side effect and the engine undoes whatever entries it finds. This module is the model only, pure,
so that the claim planners can name the MIG instances a claim owns without importing the disk
layer; `record_codec` is its JSON form, `record_store` keeps the records on disk.
"""

from typing import Literal, TypeVar

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.claims.effect_entries import EffectEntry
from dra_driver.claims.identity import ClaimRef

RecordState = Literal["preparing", "prepared"]

_Entry = TypeVar("_Entry", bound=EffectEntry)


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


class ClaimRecord(msgspec.Struct, frozen=True):
    """Two-phase: "preparing" is on disk before any side effect, "prepared" before kubelet hears
    of it, and "preparing" again before unprepare undoes side effects. A "preparing" record found
    at start is a prepare or unprepare cut short; its side effects are rolled back."""

    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
    state: RecordState = "prepared"
    # What the claim changed on the node, each entry written before the change is made, so that
    # unprepare, and the rollback after a crash, undo it.
    effects: tuple[EffectEntry, ...] = ()
    # While preparing: the exclusive devices the claim has taken (also in the shared reservation
    # table), kept here too so that a crash that leaves this record leaves them taken until the
    # record is rolled back.
    reserved: tuple[str, ...] = ()
    # The claim's metadata.generation that prepare read: what its status conditions observed.
    generation: int | None = None

    @property
    def has_side_effects(self) -> bool:
        return bool(self.effects)

    @property
    def exclusive_keys(self) -> tuple[str, ...]:
        return self.reserved + tuple(d.exclusive_key for d in self.devices if d.exclusive_key)

    def entries(self, kind: type[_Entry]) -> tuple[_Entry, ...]:
        """The record's effects of one kind, in the order they were recorded."""
        return tuple(entry for entry in self.effects if isinstance(entry, kind))

    def without(self, gone: tuple[EffectEntry, ...]) -> "ClaimRecord":
        """The record less some of its effects (undone, or never made)."""
        return msgspec.structs.replace(self, effects=tuple(e for e in self.effects if e not in gone))
