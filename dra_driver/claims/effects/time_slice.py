"""Time slices a claim's sharing settings set on its GPUs.

The record keeps only the GPU: a changed time slice goes back to Default, not to what the GPU had
before (that may have been another claim's setting or a crash's leftover; nothing records what an
administrator meant), as NVIDIA's DRA driver also does.
"""

from collections.abc import Sequence

from dra_driver.claims.effect_entries import EffectEntry, TimeSliceEntry
from dra_driver.claims.effects.contract import Made, SideEffect
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.model import TimeSliceSetting
from dra_driver.hardware.time_slicing import TimeSlicer


class TimeSlices(SideEffect[TimeSliceSetting]):
    action_type = TimeSliceSetting

    def __init__(self, time_slicer: TimeSlicer) -> None:
        self._time_slicer = time_slicer

    def entry(self, action: TimeSliceSetting) -> EffectEntry:
        return TimeSliceEntry(action.gpu_uuid)

    async def apply(self, ref: ClaimRef, actions: Sequence[TimeSliceSetting]) -> Made:
        for change in actions:
            await self._time_slicer.set_time_slice(change.gpu_uuid, change.interval)
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        for entry in record.entries(TimeSliceEntry):
            await self._time_slicer.set_time_slice(entry.gpu_uuid, "Default")
        return record
