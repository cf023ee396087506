"""Whole GPUs set to ExclusiveProcess for a claim's MPS daemon (NVIDIA's MPS documentation: the
MPS server is then the only CUDA context on them), with the mode each had before to put back.
The mode to restore is read before the entry is written, so the entry is the action too."""

from collections.abc import Sequence

from dra_driver.claims.effect_entries import ComputeModeEntry, EffectEntry
from dra_driver.claims.effects.contract import Made, SideEffect
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.backend import ComputeModes


class ExclusiveProcessModes(SideEffect[ComputeModeEntry]):
    action_type = ComputeModeEntry

    def __init__(self, modes: ComputeModes) -> None:
        self._modes = modes

    async def actions(self, gpu_uuids: Sequence[str]) -> tuple[ComputeModeEntry, ...]:
        """The GPUs' modes now, to record before they change."""
        return tuple(
            [ComputeModeEntry(gpu_uuid, await self._modes.compute_mode(gpu_uuid)) for gpu_uuid in gpu_uuids]
        )

    def entry(self, action: ComputeModeEntry) -> EffectEntry:
        return action

    async def apply(self, ref: ClaimRef, actions: Sequence[ComputeModeEntry]) -> Made:
        for action in actions:
            await self._modes.set_compute_mode(action.gpu_uuid, "ExclusiveProcess")
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        for entry in record.entries(ComputeModeEntry):
            await self._modes.set_compute_mode(entry.gpu_uuid, entry.restore)
        return record
