"""A claim's HAMi-core directory on the host (its preload file and shared usage region).

Made by `apply`, as every effect's change is, from the host entries the claim's vGPU edits name
(edits/vgpu_edits.py: the CDI spec mounts them, so they exist before it is written). What it
makes is found by claim UID, not by a record entry (`recorded` False): a crash after `apply` and
before any record leaves a directory that start-up sweeps (no record owns it), and every claim's
undo removes it (there may be none), so no entry has to be on disk before it is made.
"""

import asyncio
from collections.abc import Sequence

import msgspec

from dra_driver.claims.edits.vgpu_edits import HamiCore, HostEntry
from dra_driver.claims.edits.vgpu_host import (
    claim_directory_uids,
    create_host_entries,
    remove_claim_directory,
)
from dra_driver.claims.effect_entries import EffectEntry
from dra_driver.claims.effects.contract import Leftovers, Made, SideEffect
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord


class HamiCoreHostEntries(msgspec.Struct, frozen=True):
    """The action: the claim's directory, preload file and cache directory, and the node-wide
    lock directory, as `vgpu_claim_edits` names them."""

    entries: tuple[HostEntry, ...]


class HamiCoreDirectories(SideEffect[HamiCoreHostEntries]):
    action_type = HamiCoreHostEntries
    recorded = False

    def __init__(self, hami_core: HamiCore) -> None:
        self._hami_core = hami_core

    def entry(self, action: HamiCoreHostEntries) -> EffectEntry:
        raise TypeError("a HAMi-core directory is found by claim UID, not recorded")

    async def apply(self, ref: ClaimRef, actions: Sequence[HamiCoreHostEntries]) -> Made:
        for action in actions:
            await asyncio.to_thread(create_host_entries, action.entries)
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        await self._remove(record.claim.uid)
        return record

    def leftovers(self) -> Leftovers:
        return Leftovers(
            lambda: asyncio.to_thread(claim_directory_uids, self._hami_core),
            self._remove,
            lambda _record: True,
        )

    async def _remove(self, claim_uid: str) -> None:
        await asyncio.to_thread(remove_claim_directory, self._hami_core, claim_uid)
