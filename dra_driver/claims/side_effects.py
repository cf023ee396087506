"""What preparing a claim changes on the node outside its CDI spec and record, and the undo of it.

MIG instances (created on the GPU), time slices (set per GPU), MPS control daemons (one per
claim) and HAMi-core claim directories. The engine decides when each runs, so that the claim's
"preparing" record names a side effect before it happens (see engine.py); this module only knows
how to do and undo them. Every undo is safe to repeat and tolerates a side effect that never
happened or is already gone, because a crash can cut any step short.

This is the only user of the hardware backend, the sharing controls and HAMi-core in the claim
path. Each is optional: without a backend a claim that needs a MIG instance created is refused;
without sharing controls or HAMi-core, what would need them is left out.
"""

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.edits.cdi import ContainerEdits
from dra_driver.claims.edits.vgpu_edits import HamiCore, MpsShareEdits, vgpu_claim_edits
from dra_driver.claims.edits.vgpu_host import (
    claim_directory_uids,
    create_host_entries,
    remove_claim_directory,
)
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.prepared import CreatedMig
from dra_driver.claims.records import ClaimRecord, ComputeModeRecord, MigInstanceRecord
from dra_driver.claims.sharing.gpu_mps_daemons import GpuMpsDaemons
from dra_driver.claims.sharing.mps import MpsDaemonRunner
from dra_driver.claims.sharing.sharing import (
    SharedDevice,
    SharingPlan,
    check_sharing,
    plan_sharing,
    vgpu_share_mps_edits,
)
from dra_driver.claims.vgpu_grant import VgpuGrant
from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.backend import ComputeModes, HardwareBackend
from dra_driver.hardware.model import HardwareError, HardwareErrorReason, MigInstance, Placement
from dra_driver.hardware.time_slicing import TimeSlicer
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


class MigCreateRefused(ClaimRejected):
    """NVML refused to make one of the claim's MIG instances: `created` are those made before it.
    The refused one does not exist, so an instance at its placement is someone else's (made by
    hand, or another claim's) and the rollback must leave it: the rollback destroys by profile
    and placement, and would otherwise take it."""

    def __init__(self, message: str, created: tuple[MigInstanceRecord, ...]) -> None:
        super().__init__(message)
        self.created = created


class SharingControls(msgspec.Struct, frozen=True):
    """Where time slices are set and MPS daemons run (per backend: nvidia-smi and the driver's
    MPS control program, or their simulated stand-ins)."""

    time_slicer: TimeSlicer
    mps: MpsDaemonRunner
    # Where whole GPUs' compute modes are set for MPS (None: left as they are).
    compute_modes: ComputeModes | None = None


class Leftovers(msgspec.Struct, frozen=True):
    """One kind of per-claim runtime state, found by claim UID, that start-up removes where no
    record owns it (a crash between creating it and recording it, or between the two undos)."""

    claim_uids: Callable[[], Awaitable[set[str]]]
    remove: Callable[[str], Awaitable[None]]
    owned_by: Callable[[ClaimRecord], bool]


class ClaimSideEffects:
    def __init__(
        self,
        *,
        pool_name: str,
        inventory: Inventory,
        hardware: HardwareBackend | None,
        sharing: SharingControls | None,
        hami_core: HamiCore | None,
        gpu_mps: GpuMpsDaemons | None,
    ) -> None:
        """`inventory`: to name a destroyed MIG instance's device in the log, and the GPUs whose
        MPS daemons are not claims' (`gpu_mps`: the daemons of vGPU shares under MPS, run by
        `sharing`'s runner; None without sharing controls)."""
        self._pool_name = pool_name
        self._inventory = inventory
        self._hardware = hardware
        self._sharing = sharing
        self._hami_core = hami_core
        self._gpu_mps = gpu_mps

    def use_inventory(self, inventory: Inventory) -> None:
        self._inventory = inventory

    # -- doing ---------------------------------------------------------------------------------

    async def create_mig_instances(self, ref: ClaimRef, wanted: tuple[MigInstanceRecord, ...]) -> CreatedMig:
        created: dict[MigInstanceRecord, MigInstance] = {}
        for instance in wanted:
            if self._hardware is None:
                raise ClaimRejected(f"claim {ref}: this node cannot create MIG instances")
            try:
                created[instance] = await self._hardware.create_mig_instance(
                    instance.gpu_uuid,
                    instance.profile_id,
                    _placement(instance),
                )
                failpoints.reached("prepare.mig-created")
            except HardwareError as error:
                message = f"claim {ref}: cannot create its MIG instance: {error}"
                if error.reason in _REFUSED:
                    raise MigCreateRefused(message, tuple(created)) from error
                raise ClaimRejected(message) from error
        return created

    def sharing_plan(
        self, ref: ClaimRef, planned: tuple[PlannedDevice, ...], created: CreatedMig
    ) -> SharingPlan:
        """Pure: the time slices and MPS daemon the claim's sharing settings ask for."""
        if self._sharing is None:
            return SharingPlan()
        shared = _shared_devices(planned, lambda record: created[record].uuid)
        return plan_sharing(ref.uid, shared, self._sharing.mps.runtime_dir)

    def check_sharing(self, planned: tuple[PlannedDevice, ...]) -> None:
        """Pure: refuses what sharing_plan would refuse, before any side effect (its reasons are
        in the claim's configs alone). A MIG instance yet to be created has no UUID: its
        placeholder says so in the message that lists the claim's devices."""
        if self._sharing is not None:
            check_sharing(_shared_devices(planned, lambda _: "a MIG instance not created yet"))

    async def compute_modes_to_restore(self, plan: SharingPlan) -> tuple[ComputeModeRecord, ...]:
        """The modes the plan's ExclusiveProcess GPUs have now, for the record before they change."""
        if self._sharing is None or self._sharing.compute_modes is None:
            return ()
        modes = self._sharing.compute_modes
        return tuple(
            [
                ComputeModeRecord(gpu_uuid, await modes.compute_mode(gpu_uuid))
                for gpu_uuid in plan.exclusive_process_gpus
            ]
        )

    async def apply_sharing(self, ref: ClaimRef, plan: SharingPlan) -> None:
        if self._sharing is None:
            return
        try:
            for change in plan.time_slices:
                await self._sharing.time_slicer.set_time_slice(change.gpu_uuid, change.interval)
            if self._sharing.compute_modes is not None:
                for gpu_uuid in plan.exclusive_process_gpus:
                    await self._sharing.compute_modes.set_compute_mode(gpu_uuid, "ExclusiveProcess")
            if plan.mps:
                await self._sharing.mps.start(plan.mps)
                failpoints.reached("prepare.mps-started")
        except HardwareError as error:
            raise ClaimRejected(f"claim {ref}: cannot set up GPU sharing: {error}") from error

    async def attach_gpu_daemons(self, ref: ClaimRef, gpu_uuids: tuple[str, ...]) -> None:
        """The MPS daemons of the GPUs of the claim's vGPU shares under MPS, answering when this
        returns; the claim's "preparing" record names the GPUs already."""
        if gpu_uuids and self._gpu_mps is None:
            raise ClaimRejected(f"claim {ref}: vgpu.enforcement mps needs MPS daemons; this node runs none")
        for gpu_uuid in gpu_uuids:
            assert self._gpu_mps is not None
            await self._gpu_mps.attach(ref, gpu_uuid)

    async def vgpu_edits(self, ref: ClaimRef, planned: tuple[PlannedDevice, ...]) -> ContainerEdits:
        """The HAMi-core limits every container of the claim gets with its vGPU devices (granted
        in the plan), in the order CUDA enumerates them; with HAMi-core configured, also the
        library, the preload file and the claim's shared directory, created on the host here (no
        record names it: start-up finds it by claim UID)."""
        shares = [device.grant for device in planned if device.grant]
        if not shares:
            return ContainerEdits()
        claim_edits = vgpu_claim_edits(ref.uid, shares, self._hami_core, self._mps_share_edits())
        await asyncio.to_thread(create_host_entries, claim_edits.host_entries)
        return claim_edits.edits

    def _mps_share_edits(self) -> MpsShareEdits | None:
        if self._sharing is None:
            return None
        runtime_dir = self._sharing.mps.runtime_dir

        def edits(share: VgpuGrant) -> ContainerEdits:
            return vgpu_share_mps_edits(runtime_dir, share.gpu.uuid, share.cores, share.memory_bytes)

        return edits

    # -- undoing -------------------------------------------------------------------------------

    async def undo(self, record: ClaimRecord) -> None:
        """MPS daemons first (their clients lose the GPU either way; a GPU's daemon only when no
        other claim's record names it), then the compute modes they needed, then time slices,
        then MIG, then the claim's HAMi-core directory."""
        if self._gpu_mps is not None:
            left = record
            for gpu_uuid in record.mps_gpus:
                left = await self._gpu_mps.detach(left, gpu_uuid)
        if self._sharing is not None:
            if record.mps:
                await self._sharing.mps.stop(record.claim.uid)
            if self._sharing.compute_modes is not None:
                for entry in record.compute_modes:
                    await self._sharing.compute_modes.set_compute_mode(entry.gpu_uuid, entry.restore)
            for gpu_uuid in record.time_sliced_gpus:
                await self._sharing.time_slicer.set_time_slice(gpu_uuid, "Default")
        await self._destroy_mig_instances(record.mig_instances)
        if self._hami_core is not None:
            await asyncio.to_thread(remove_claim_directory, self._hami_core, record.claim.uid)

    async def _destroy_mig_instances(self, wanted: tuple[MigInstanceRecord, ...]) -> None:
        if not wanted or self._hardware is None:
            return
        gpus = {gpu.uuid: gpu for gpu in await self._hardware.discover()}
        for record in wanted:
            gpu = gpus.get(record.gpu_uuid)
            existing = [
                instance
                for instance in (gpu.mig_instances if gpu else ())
                if instance.profile_id == record.profile_id and instance.placement == _placement(record)
            ]
            for instance in existing:
                try:
                    await self._hardware.destroy_mig_instance(record.gpu_uuid, instance.gpu_instance_id)
                except HardwareError as error:
                    if error.reason is not HardwareErrorReason.NOT_FOUND:
                        raise
                failpoints.reached("unprepare.mig-destroyed")
                log.info(
                    "MIG instance destroyed",
                    pool=self._pool_name,
                    device=self._mig_device_name(record),
                    gpu=record.gpu_uuid,
                    gpu_instance=instance.gpu_instance_id,
                )

    def _mig_device_name(self, record: MigInstanceRecord) -> str:
        """The published device a MIG instance stands for, for log lines."""
        name = self._inventory.dynamic_mig_name(record.gpu_uuid, record.profile_id, record.placement_start)
        return name or f"{record.gpu_uuid} profile {record.profile_id} at slice {record.placement_start}"

    # -- for start-up --------------------------------------------------------------------------

    def leftovers(self) -> tuple[Leftovers, ...]:
        """The per-claim runtime state this node can have, in the order start-up sweeps it."""
        found: list[Leftovers] = []
        if self._hami_core is not None:
            hami_core = self._hami_core
            found.append(
                Leftovers(
                    lambda: asyncio.to_thread(claim_directory_uids, hami_core),
                    self._remove_hami_core_directory,
                    lambda _record: True,
                )
            )
        if self._sharing is not None:
            found.append(Leftovers(self._claim_daemon_uids, self._stop_daemon, lambda record: record.mps))
        return tuple(found)

    async def _claim_daemon_uids(self) -> set[str]:
        """The runner's daemons less the GPUs' (`reconcile_gpu_daemons` looks after those)."""
        assert self._sharing is not None
        found = await self._sharing.mps.leftover_claim_uids()
        if self._gpu_mps is None:
            return found
        return found - set(await self._gpu_mps.daemon_keys(self._gpu_uuids()))

    def _gpu_uuids(self) -> set[str]:
        return {plan.gpu.uuid for plan in self._inventory.plans}

    async def reconcile_gpu_daemons(self) -> None:
        if self._gpu_mps is not None:
            await self._gpu_mps.reconcile(self._gpu_uuids())

    async def mps_daemon_gone(self, record: ClaimRecord) -> bool:
        """Whether the claim should have an MPS daemon and has none (with --mps-daemons process,
        the agent's container was restarted, and the daemon with it; in a pod, the daemon died)."""
        if self._sharing is None or not record.mps:
            return False
        return not await self._sharing.mps.is_running(record.claim.uid)

    async def _remove_hami_core_directory(self, claim_uid: str) -> None:
        assert self._hami_core is not None
        await asyncio.to_thread(remove_claim_directory, self._hami_core, claim_uid)

    async def _stop_daemon(self, claim_uid: str) -> None:
        assert self._sharing is not None
        log.info("stopping an MPS daemon no prepared claim owns", claim_uid=claim_uid)
        await self._sharing.mps.stop(claim_uid)


def _placement(instance: MigInstanceRecord) -> Placement:
    return Placement(instance.placement_start, instance.placement_size)


def _shared_devices(
    planned: tuple[PlannedDevice, ...], created_uuid: Callable[[MigInstanceRecord], str]
) -> list[SharedDevice]:
    """The claim's devices as sharing sees them; admin access only watches (KEP-5018)."""
    shared = []
    for device in planned:
        if device.result.admin_access:
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
