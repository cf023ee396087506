"""The contract every side effect of a prepare keeps, and what start-up sweeps of each.

Why one contract: the engine's record protocol (engine.py) is the same for every change a claim
makes on the node: its entry is on disk before the change, the change is undone from the entry
alone, every undo is safe to repeat and tolerates a change that never happened or is already
gone (a crash can cut any step short). Written once here and looped over by the engine, the
protocol is proven once for all effects (tests/unit/claims/test_effect_seam.py), and a new kind
of change is one module and one registry line.
"""

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

import msgspec

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.edits.cdi import ContainerEdits
from dra_driver.claims.effect_entries import EffectEntry
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.model import MigInstance

# What an effect made that the claim's devices are named by (the MIG instances it created, by
# their entry); every other effect makes nothing of the kind.
Made = Mapping[EffectEntry, MigInstance]

ActionT = TypeVar("ActionT")


class EffectRefused(ClaimRejected):
    """An effect was refused before it changed anything: `not_made` are the record's entries whose
    changes do not exist, so the rollback must leave whatever stands at their place (a MIG
    instance at a refused placement is someone else's)."""

    def __init__(self, message: str, not_made: tuple[EffectEntry, ...]) -> None:
        super().__init__(message)
        self.not_made = not_made


class Leftovers(msgspec.Struct, frozen=True):
    """One kind of per-claim runtime state, found by claim UID, that start-up removes where no
    record owns it (a crash between creating it and recording it, or between the two undos)."""

    claim_uids: Callable[[], Awaitable[set[str]]]
    remove: Callable[[str], Awaitable[None]]
    owned_by: Callable[[ClaimRecord], bool]


class SideEffect(abc.ABC, Generic[ActionT]):
    """One kind of change a prepare makes on the node. `action_type`: what the engine hands to
    `apply` (the change with everything it needs); `entry` is what the record keeps of it."""

    action_type: type[ActionT]
    # What the effect does, for the claim's error when the hardware refuses it.
    doing = "set up GPU sharing"
    # False: what the effect makes is found by claim UID alone (its `leftovers` own it for any
    # record, and its undo runs for every claim), so no entry names it and none has to be on
    # record before it is made; `entries` leaves it out (effects/hami_core).
    recorded = True

    async def claim_actions(self, ref: ClaimRef, planned: Sequence[PlannedDevice]) -> Sequence[ActionT]:
        """What the claim's devices need of this effect before anything else is made (the MIG
        instances to create, the GPUs to give to a VM), asked before the record that names them
        is written; raises ClaimRejected where the node cannot make them. Most effects follow
        from the claim's sharing plan instead, and need nothing here."""
        return ()

    def container_edits(self, device: PlannedDevice) -> ContainerEdits | None:
        """The container edits of a device whose hand-over is this effect's (a GPU given to a VM
        gets the VFIO nodes, not the driver's); None: the backend's edits of its type."""
        return None

    @abc.abstractmethod
    def entry(self, action: ActionT) -> EffectEntry:
        """What the record says of the action, written before it is applied."""

    @abc.abstractmethod
    async def apply(self, ref: ClaimRef, actions: Sequence[ActionT]) -> Made:
        """Makes the changes; raises ClaimRejected (EffectRefused where nothing was changed)."""

    @abc.abstractmethod
    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        """Undoes what the record's entries of this kind name; returns the record as it stands
        after (an effect shared with other claims writes the record as it goes: gpu_mps_share)."""

    def leftovers(self) -> Leftovers | None:
        """Runtime state of this kind found by claim UID, for start-up (None: none is)."""
        return None

    async def at_start(self, records: Mapping[str, ClaimRecord]) -> None:
        """Start-up's look at state shared by claims, after the sweeps; `records`: the prepared
        claims (a daemon that should run and does not is reported, not restarted)."""

    def mine(self, actions: Sequence[object]) -> list[ActionT]:
        return [action for action in actions if isinstance(action, self.action_type)]
