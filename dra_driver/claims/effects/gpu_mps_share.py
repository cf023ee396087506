"""A vGPU share's place in its GPU's MPS daemon (vgpu.enforcement mps): one daemon per GPU,
started with the GPU's first share and stopped with its last (gpu_mps_daemons counts them from
the records, which is why this effect's undo writes the record as it goes)."""

from collections.abc import Callable, Collection, Mapping, Sequence

from dra_driver.claims.effect_entries import EffectEntry, GpuMpsEntry
from dra_driver.claims.effects.contract import Made, SideEffect
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.gpu_mps_daemons import GpuMpsDaemons


class GpuMpsShares(SideEffect[GpuMpsEntry]):
    action_type = GpuMpsEntry

    def __init__(self, daemons: GpuMpsDaemons | None, gpu_uuids: Callable[[], Collection[str]]) -> None:
        """`daemons`: None on a node without sharing controls, where such a share is refused."""
        self._daemons = daemons
        self._gpu_uuids = gpu_uuids

    def entry(self, action: GpuMpsEntry) -> EffectEntry:
        return action

    async def apply(self, ref: ClaimRef, actions: Sequence[GpuMpsEntry]) -> Made:
        """The daemons answer when this returns; the "preparing" record names the GPUs already."""
        if actions and self._daemons is None:
            raise ClaimRejected(f"claim {ref}: vgpu.enforcement mps needs MPS daemons; this node runs none")
        for action in actions:
            assert self._daemons is not None
            await self._daemons.attach(ref, action.gpu_uuid)
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        if self._daemons is None:
            return record
        left = record
        for entry in record.entries(GpuMpsEntry):
            left = await self._daemons.detach(left, entry.gpu_uuid)
        return left

    async def at_start(self, records: Mapping[str, ClaimRecord]) -> None:
        if self._daemons is not None:
            await self._daemons.reconcile(self._gpu_uuids())
