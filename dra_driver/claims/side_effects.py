"""What preparing a claim changes on the node outside its CDI spec and record, and the undo of it.

The changes themselves are the effects of `effects/` (MIG instances, time slices, compute modes,
MPS daemons, HAMi-core directories), each behind one contract; this module is the engine's one
door to them: it turns a claim's plan into actions, applies them kind by kind in the registry's
order and undoes a record's entries in the reverse order. The engine decides when each runs, so
that the claim's "preparing" record names a change before it happens (see engine.py).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import structlog

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.edits.cdi import ContainerEdits
from dra_driver.claims.edits.vgpu_edits import HamiCore, MpsShareEdits, vgpu_claim_edits
from dra_driver.claims.effect_entries import EffectEntry, GpuMpsEntry, MigInstanceEntry
from dra_driver.claims.effects.compute_mode import ExclusiveProcessModes
from dra_driver.claims.effects.contract import Leftovers, Made, SideEffect
from dra_driver.claims.effects.hami_core import HamiCoreHostEntries
from dra_driver.claims.effects.registry import EffectControls, NodeControls, SharingControls, node_effects
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.gpu_mps_daemons import GpuMpsDaemons
from dra_driver.claims.sharing.sharing import (
    SharedDevice,
    SharingPlan,
    check_sharing,
    plan_sharing,
    vgpu_share_mps_edits,
)
from dra_driver.claims.vgpu_grant import VgpuGrant
from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.model import HardwareError

__all__ = ["ClaimSideEffects", "EffectControls", "SharingControls"]

log = structlog.get_logger("dra_driver.claims")


class ClaimSideEffects:
    def __init__(
        self,
        *,
        pool_name: str,
        inventory: Inventory,
        controls: EffectControls,
        hami_core: HamiCore | None,
        gpu_mps: GpuMpsDaemons | None,
    ) -> None:
        """`inventory`: to name a destroyed MIG instance's device in the log, and the GPUs whose
        MPS daemons are not claims' (`gpu_mps`: the daemons of vGPU shares under MPS, run by
        `sharing`'s runner; None without sharing controls)."""
        self._inventory = inventory
        self._sharing = controls.sharing
        self._hami_core = hami_core
        self._effects = node_effects(
            NodeControls(
                pool_name=pool_name,
                platform=controls,
                hami_core=hami_core,
                gpu_mps=gpu_mps,
                mig_device_name=self._mig_device_name,
                gpu_uuids=self._gpu_uuids,
            )
        )
        # The effect that reads the compute modes to restore before the record is written.
        self._modes = _one_of(self._effects, ExclusiveProcessModes)

    def use_inventory(self, inventory: Inventory) -> None:
        self._inventory = inventory

    # -- doing ---------------------------------------------------------------------------------

    async def claim_actions(self, ref: ClaimRef, planned: tuple[PlannedDevice, ...]) -> tuple[object, ...]:
        """What the claim's devices need made before anything else, effect by effect (the MIG
        instances to create, the GPUs to give to a VM with the driver each has now)."""
        actions: list[object] = []
        for effect in self._effects:
            actions.extend(await effect.claim_actions(ref, planned))
        return tuple(actions)

    def device_edits(self, planned: tuple[PlannedDevice, ...]) -> dict[str, ContainerEdits]:
        """Pure: the container edits of the devices an effect hands over itself, by CDI name."""
        handed: dict[str, ContainerEdits] = {}
        for device in planned:
            for effect in self._effects:
                if (edits := effect.container_edits(device)) is not None:
                    handed[device.cdi_name] = edits
                    break
        return handed

    def entries(self, actions: Sequence[object]) -> tuple[EffectEntry, ...]:
        """What the record says of `actions`, in the order they are applied."""
        return tuple(
            effect.entry(action)
            for effect in self._effects
            if effect.recorded
            for action in effect.mine(actions)
        )

    async def apply(self, ref: ClaimRef, actions: Sequence[object]) -> Made:
        """Applies `actions` effect by effect, in the registry's order; an action no effect of
        this node takes is refused (a share under MPS on a node that runs no daemons is refused
        by its effect, which is always there)."""
        made: dict[EffectEntry, Any] = {}
        for effect in self._effects:
            mine = effect.mine(actions)
            if not mine:
                continue
            try:
                made.update(await effect.apply(ref, mine))
            except HardwareError as error:
                raise ClaimRejected(f"claim {ref}: cannot {effect.doing}: {error}") from error
        return made

    def sharing_plan(self, ref: ClaimRef, planned: tuple[PlannedDevice, ...], made: Made) -> SharingPlan:
        """Pure: the time slices and MPS daemon the claim's sharing settings ask for."""
        if self._sharing is None:
            return SharingPlan()
        shared = _shared_devices(planned, lambda entry: made[entry].uuid)
        return plan_sharing(ref.uid, shared, self._sharing.mps.runtime_dir)

    def check_sharing(self, planned: tuple[PlannedDevice, ...]) -> None:
        """Pure: refuses what sharing_plan would refuse, before any side effect (its reasons are
        in the claim's configs alone). A MIG instance yet to be created has no UUID: its
        placeholder says so in the message that lists the claim's devices."""
        for device in planned:
            refusal, kind = device.origin.refuses_config, type(device.config)
            if refusal and not device.result.admin_access and device.config != kind():
                remove = f"remove the claim's {kind.__name__} for it"
                raise ClaimRejected(f"device {device.name} {refusal}; {remove}")
        if self._sharing is not None:
            check_sharing(_shared_devices(planned, lambda _: "a MIG instance not created yet"))

    async def sharing_actions(
        self, ref: ClaimRef, plan: SharingPlan, planned: tuple[PlannedDevice, ...]
    ) -> tuple[object, ...]:
        """The plan's changes as actions, with the compute modes to restore read now (they go on
        record before they change), the GPUs of the claim's vGPU shares under MPS, and the
        HAMi-core directory its vGPU edits mount (effects/hami_core, last in the registry)."""
        modes = self._modes
        return (
            *plan.time_slices,
            *(() if modes is None else await modes.actions(plan.exclusive_process_gpus)),
            *(() if plan.mps is None else (plan.mps,)),
            *(
                GpuMpsEntry(device.grant.gpu.uuid)
                for device in planned
                if device.grant is not None and device.grant.enforcement == "mps"
            ),
            *self._hami_core_actions(ref, planned),
        )

    def _hami_core_actions(
        self, ref: ClaimRef, planned: tuple[PlannedDevice, ...]
    ) -> tuple[HamiCoreHostEntries, ...]:
        """The host entries of the claim's vGPU edits, where HAMi-core enforces its shares."""
        shares = [device.grant for device in planned if device.grant]
        if not shares or self._hami_core is None:
            return ()
        host = vgpu_claim_edits(ref.uid, shares, self._hami_core, self._mps_share_edits()).host_entries
        return (HamiCoreHostEntries(host),) if host else ()

    def vgpu_edits(self, ref: ClaimRef, planned: tuple[PlannedDevice, ...]) -> ContainerEdits:
        """Pure: the HAMi-core limits every container of the claim gets with its vGPU devices
        (granted in the plan), in the order CUDA enumerates them; with HAMi-core configured, also
        the library, the preload file and the claim's shared directory, which `sharing_actions`
        had made on the host (effects/hami_core)."""
        shares = [device.grant for device in planned if device.grant]
        if not shares:
            return ContainerEdits()
        return vgpu_claim_edits(ref.uid, shares, self._hami_core, self._mps_share_edits()).edits

    def _mps_share_edits(self) -> MpsShareEdits | None:
        if self._sharing is None:
            return None
        runtime_dir = self._sharing.mps.runtime_dir

        def edits(share: VgpuGrant) -> ContainerEdits:
            return vgpu_share_mps_edits(runtime_dir, share.gpu.uuid, share.cores, share.memory_bytes)

        return edits

    # -- undoing -------------------------------------------------------------------------------

    async def undo(self, record: ClaimRecord) -> None:
        """Every effect's undo, in the reverse of the order prepare makes them: MPS daemons first
        (their clients lose the GPU either way), then the compute modes they needed, then time
        slices, then MIG; each reads its own entries of the record."""
        left = record
        for effect in reversed(self._effects):
            left = await effect.undo(left)

    def _mig_device_name(self, entry: MigInstanceEntry) -> str:
        """The published device a MIG instance stands for, for log lines."""
        name = self._inventory.dynamic_mig_name(entry.gpu_uuid, entry.profile_id, entry.placement_start)
        return name or f"{entry.gpu_uuid} profile {entry.profile_id} at slice {entry.placement_start}"

    # -- for start-up --------------------------------------------------------------------------

    def leftovers(self) -> tuple[Leftovers, ...]:
        """The per-claim runtime state this node can have, in the order start-up sweeps it."""
        found = (effect.leftovers() for effect in reversed(self._effects))
        return tuple(leftovers for leftovers in found if leftovers is not None)

    async def at_start(self, records: Mapping[str, ClaimRecord]) -> None:
        """After the sweeps: each effect's look at the state claims share (`records`: prepared)."""
        for effect in reversed(self._effects):
            await effect.at_start(records)

    def _gpu_uuids(self) -> set[str]:
        return {plan.gpu.uuid for plan in self._inventory.plans}


_Effect = TypeVar("_Effect", bound=SideEffect[Any])


def _one_of(effects: Sequence[SideEffect[Any]], kind: type[_Effect]) -> _Effect | None:
    """The node's effect of `kind`, if the node can make it (registry.node_effects)."""
    return next((effect for effect in effects if isinstance(effect, kind)), None)


def _shared_devices(
    planned: tuple[PlannedDevice, ...], created_uuid: Callable[[MigInstanceEntry], str]
) -> list[SharedDevice]:
    """The claim's devices as sharing sees them; admin access only watches (KEP-5018)."""
    shared = []
    for device in planned:
        if device.result.admin_access or device.origin.refuses_config:
            continue
        mig_uuid = None
        if device.device.type == "mig":
            if device.create_mig:
                mig_uuid = created_uuid(device.create_mig)
            elif device.existing_mig:
                mig_uuid = device.existing_mig.uuid
        shared.append(
            SharedDevice(
                name=device.name,
                type=device.device.type,
                gpu_uuid=device.gpu.uuid,
                sharing=device.config.sharing,
                mig_uuid=mig_uuid,
            )
        )
    return shared
