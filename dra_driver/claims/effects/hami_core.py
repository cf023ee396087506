"""A claim's HAMi-core directory on the host (its shared usage region).

It is made with the claim's vGPU edits (side_effects.vgpu_edits: the edits name its files), so it
takes no action here, and no record entry names it: it is found by claim UID, removed with every
claim's undo (there may be none), and swept at start where no record owns it.
"""

import asyncio
from collections.abc import Sequence

from dra_driver.claims.edits.vgpu_edits import HamiCore
from dra_driver.claims.edits.vgpu_host import claim_directory_uids, remove_claim_directory
from dra_driver.claims.effect_entries import EffectEntry
from dra_driver.claims.effects.contract import Leftovers, Made, NoAction, SideEffect
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord


class HamiCoreDirectories(SideEffect[NoAction]):
    action_type = NoAction

    def __init__(self, hami_core: HamiCore) -> None:
        self._hami_core = hami_core

    def entry(self, action: NoAction) -> EffectEntry:
        raise TypeError("a HAMi-core directory is found by claim UID, not recorded")

    async def apply(self, ref: ClaimRef, actions: Sequence[NoAction]) -> Made:
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
