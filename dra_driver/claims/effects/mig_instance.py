"""MIG instances a claim creates on its GPU (dynamic MIG), and their destruction.

Recorded by GPU, profile and placement, which identify an instance on the GPU before it exists:
the rollback after a crash finds and destroys it whether or not its creation finished.
"""

from collections.abc import Callable, Sequence

import structlog

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.effect_entries import EffectEntry, MigInstanceEntry
from dra_driver.claims.effects.contract import EffectRefused, Made, SideEffect
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.backend import HardwareBackend
from dra_driver.hardware.model import HardwareError, HardwareErrorReason, MigInstance
from dra_driver.state import failpoints

log = structlog.get_logger("dra_driver.claims")

# NVML's answers that say the instance was not made. Any other failure (a lost GPU, a driver that
# did not answer) may have made it, so the rollback looks for it.
_REFUSED = frozenset(
    {
        HardwareErrorReason.INVALID_ARGUMENT,
        HardwareErrorReason.NOT_SUPPORTED,
        HardwareErrorReason.INSUFFICIENT_RESOURCES,
        HardwareErrorReason.NO_PERMISSION,
        HardwareErrorReason.LIBRARY_NOT_FOUND,
    }
)


class MigInstances(SideEffect[MigInstanceEntry]):
    action_type = MigInstanceEntry

    def __init__(
        self, hardware: HardwareBackend | None, pool_name: str, device_name: Callable[[MigInstanceEntry], str]
    ) -> None:
        """`hardware`: None on a node that cannot create MIG instances. `device_name`: the
        published device an instance stands for, for log lines."""
        self._hardware = hardware
        self._pool_name = pool_name
        self._device_name = device_name

    async def claim_actions(
        self, ref: ClaimRef, planned: Sequence[PlannedDevice]
    ) -> Sequence[MigInstanceEntry]:
        return [device.create_mig for device in planned if device.create_mig]

    def entry(self, action: MigInstanceEntry) -> EffectEntry:
        return action

    async def apply(self, ref: ClaimRef, actions: Sequence[MigInstanceEntry]) -> Made:
        created: dict[EffectEntry, MigInstance] = {}
        for wanted in actions:
            if self._hardware is None:
                raise ClaimRejected(f"claim {ref}: this node cannot create MIG instances")
            try:
                created[wanted] = await self._hardware.create_mig_instance(
                    wanted.gpu_uuid, wanted.profile_id, wanted.placement
                )
                failpoints.reached("prepare.mig-created")
            except HardwareError as error:
                message = f"claim {ref}: cannot create its MIG instance: {error}"
                if error.reason in _REFUSED:
                    raise EffectRefused(message, tuple(a for a in actions if a not in created)) from error
                raise ClaimRejected(message) from error
        return created

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        wanted = record.entries(MigInstanceEntry)
        if not wanted or self._hardware is None:
            return record
        gpus = {gpu.uuid: gpu for gpu in await self._hardware.discover()}
        for entry in wanted:
            gpu = gpus.get(entry.gpu_uuid)
            existing = [
                instance
                for instance in (gpu.mig_instances if gpu else ())
                if instance.profile_id == entry.profile_id and instance.placement == entry.placement
            ]
            for instance in existing:
                try:
                    await self._hardware.destroy_mig_instance(entry.gpu_uuid, instance.gpu_instance_id)
                except HardwareError as error:
                    if error.reason is not HardwareErrorReason.NOT_FOUND:
                        raise
                failpoints.reached("unprepare.mig-destroyed")
                log.info(
                    "MIG instance destroyed",
                    pool=self._pool_name,
                    device=self._device_name(entry),
                    gpu=entry.gpu_uuid,
                    gpu_instance=instance.gpu_instance_id,
                )
        return record
