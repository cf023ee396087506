"""Prepare and unprepare: the claim engine behind both DRAPlugin versions.

Every claim of a call is handled concurrently and answered on its own: a bad claim yields an
error for that claim only, never a failed call. Device ownership is checked and taken without
yielding to the event loop, so two overlapping calls can never both get the same GPU, and
kubelet is answered only once the claim's record is on disk.

A claim with side effects (a MIG instance to create) is prepared in two phases: a "preparing"
record naming the side effects is durable before the first of them, and the "prepared" record
before kubelet is answered. A crash in between leaves the "preparing" record, and the next start
undoes what it names.

Another agent process may share the state directory (the old and the new pod of a rolling
update), so the records on disk are the truth, not this process's memory: a claim is worked on
under its own lock across processes and its record is read from disk there, and device ownership
is checked and taken in a short node-wide turn that first catches up with any peer's changes.
"""

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import structlog

from dra_driver import failpoints
from dra_driver.claims import cdi
from dra_driver.claims.allocation import ClaimRejected, allocated_devices
from dra_driver.claims.call_gate import CallGate, GateTicket
from dra_driver.claims.cdi import CdiSpec, ContainerEdits, InvalidCdiName
from dra_driver.claims.cdi_files import CdiSpecDirectory
from dra_driver.claims.claim_plan import PlannedDevice, plan_claim
from dra_driver.claims.gpu_edits import DeviceEdits
from dra_driver.claims.identity import ClaimRef, InvalidClaimIdentity, claim_ref
from dra_driver.claims.mps import MpsControlDaemons
from dra_driver.claims.opaque_config import VgpuConfig, config_entries
from dra_driver.claims.record_store import ClaimRecordStore, QuarantinedRecord
from dra_driver.claims.records import ClaimRecord, MigInstanceRecord, PreparedDevice
from dra_driver.claims.reservations import Reservation, ReservationTable, decode_table
from dra_driver.claims.sharing import SharedDevice, SharingPlan, plan_sharing
from dra_driver.claims.source import ClaimSource
from dra_driver.claims.vgpu_edits import HamiCore, vgpu_claim_edits, vgpu_share
from dra_driver.claims.vgpu_host import (
    claim_directory_uids,
    create_host_entries,
    remove_claim_directory,
)
from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.backend import HardwareBackend
from dra_driver.hardware.model import HardwareError, HardwareErrorReason, MigInstance, Placement
from dra_driver.hardware.time_slicing import TimeSlicer
from dra_driver.metrics import ClaimMetrics
from dra_driver.shared_locks import ClaimLocks, SharedStateLock, StateTurn

log = structlog.get_logger("dra_driver.claims")

# The claim-wide CDI device that connects every container of a claim to its MPS daemon.
MPS_CDI_DEVICE = "mps"
# (namespace, name, uid) exactly as kubelet sent them: untrusted until checked.
RawClaim = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class SharingControls:
    """Where time slices are set and MPS daemons run (per backend: nvidia-smi and the driver's
    MPS control program, or their simulated stand-ins)."""

    time_slicer: TimeSlicer
    mps: MpsControlDaemons


@dataclass(frozen=True, slots=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


_EXPECTED_FAILURES = (InvalidClaimIdentity, ClaimRejected, InvalidCdiName)


def _claim_context(raw: RawClaim) -> AbstractContextManager[None]:
    """Every log line written while a claim is handled names it (cut short: the values are
    untrusted until checked, and may be huge)."""
    namespace, name, uid = raw
    return structlog.contextvars.bound_contextvars(
        claim_namespace=namespace[:80], claim_name=name[:80], claim_uid=uid[:80]
    )


_T = TypeVar("_T")


async def _alone(call: Awaitable[_T]) -> list[_T]:
    return [await call]


def _concurrently(calls: list[Coroutine[object, object, _T]]) -> Awaitable[list[_T]]:
    """The claims of one call, run concurrently. Most calls carry one claim: awaited alone it
    skips gather's extra future and the loop turn its callback takes."""
    return _alone(calls[0]) if len(calls) == 1 else asyncio.gather(*calls)


_unfinished: set["asyncio.Task[None]"] = set()  # asyncio keeps only weak references to tasks


def _to_the_end(work: Awaitable[_T]) -> "asyncio.Future[_T]":
    """Runs `work` to its end even if whoever awaits the answer stops waiting (kubelet's deadline,
    a dropped connection), so memory and disk agree and kubelet's retry finds the claims done.
    What asyncio.shield does, one loop turn sooner: the work sets the answer itself, where
    shield's callback would take a turn to pass it on."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[_T] = loop.create_future()

    async def run() -> None:
        try:
            value = await work
        except asyncio.CancelledError:
            answer.cancel()  # the event loop is ending
            raise
        except BaseException as error:
            if answer.done():
                log.error("claim work failed after its caller stopped waiting", error=repr(error))
            else:
                answer.set_exception(error)
        else:
            if not answer.done():
                answer.set_result(value)

    task = loop.create_task(run())
    _unfinished.add(task)
    task.add_done_callback(_unfinished.discard)
    return answer


def _log_failure(action: str, raw: RawClaim, error: Exception) -> str:
    if isinstance(error, _EXPECTED_FAILURES):
        log.warning(f"{action} refused", reason=str(error))
        return str(error)
    log.exception(f"{action} failed unexpectedly")
    return f"internal error during {action}: {type(error).__name__}: {error}"


class ClaimEngine:
    def __init__(
        self,
        *,
        driver_name: str,
        pool_name: str,
        inventory: Inventory,
        edits: DeviceEdits,
        claim_source: ClaimSource,
        records: ClaimRecordStore,
        cdi_specs: CdiSpecDirectory,
        hardware: HardwareBackend | None = None,
        common_cdi_ids: tuple[str, ...] = (),
        sharing: SharingControls | None = None,
        hami_core: HamiCore | None = None,
        metrics: ClaimMetrics | None = None,
    ) -> None:
        """`hardware`: where MIG instances are created (None: a node without dynamic MIG).
        `common_cdi_ids`: CDI devices every prepared device also needs (the node-wide spec)."""
        self._driver_name = driver_name
        self._pool_name = pool_name
        self._inventory = inventory
        self._edits = edits
        self._hardware = hardware
        self._common_cdi_ids = common_cdi_ids
        self._sharing = sharing
        self._hami_core = hami_core
        self._metrics = metrics or ClaimMetrics()
        self._source = claim_source
        self._records = records
        self._cdi_specs = cdi_specs
        # The records on disk and the reservations of the shared table as of this process's last
        # turn (a reservation as a "preparing" record): claims prepared or being prepared, by this
        # process or a peer.
        self._records_seen: dict[str, ClaimRecord] = {}
        self._owner_of_device: dict[str, ClaimRef] = {}
        # The shared table as this process last read or wrote it, less its own finished entries.
        self._reservations = ReservationTable()
        # Claims whose devices this process has reserved and whose prepare is still under way.
        self._reserving: set[str] = set()
        self._owner_token = secrets.token_hex(8)
        self._claim_locks = ClaimLocks(records.state_dir / "claim.locks")
        self._state_lock = SharedStateLock(records.state_dir / "state.lock")

    def close(self) -> None:
        self._state_lock.close()
        self._claim_locks.close()

    def use_inventory(self, inventory: Inventory) -> None:
        """Devices published from now on (after a fallback to modes the API server supports);
        claims already prepared keep what they were prepared with."""
        self._inventory = inventory

    # -- state ---------------------------------------------------------------------------------

    async def load_state(self, boot_id: str | None = None) -> list[QuarantinedRecord]:
        """Reads the records left by earlier runs. After a reboot (`boot_id` changed) they
        describe MIG instances and CDI files that no longer exist, so they are dropped: kubelet
        prepares its pods' claims again. Prepares cut short by a crash are rolled back, and CDI
        specs no record owns are removed."""
        records, quarantined = await asyncio.to_thread(self._records.load_all)
        if boot_id is not None and await asyncio.to_thread(self._records.boot_changed, boot_id):
            # No peer can be working on these: one started since the reboot would have recorded
            # the new boot ID already.
            log.warning(
                "the node rebooted since the last run; prepared claims are forgotten", claims=len(records)
            )
            for uid in records:
                await self._records.erase(uid)
        for uid, record in records.items():
            if record.state == "preparing":
                await self._roll_back_unfinished(uid)
        async with self._state_lock.hold() as turn:
            self._refresh_view(turn)
        await self._remove_unowned(self._cdi_specs.claim_uids(), self._remove_unowned_spec)
        if self._hami_core is not None:
            hami_core_uids = claim_directory_uids(self._hami_core)
            await self._remove_unowned(hami_core_uids, self._remove_hami_core_directory)
        await self._check_mps_daemons()
        return quarantined

    async def _roll_back_unfinished(self, claim_uid: str) -> None:
        """Undoes a prepare or unprepare cut short by a crash. A live peer's call still under way
        holds the claim's lock, so this waits for it and then finds the record finished."""
        async with self._claim_locks.hold(claim_uid):
            record = self._records.read(claim_uid)
            if record is None or record.state != "preparing":
                return
            claim = record.claim
            with _claim_context((claim.namespace, claim.name, claim.uid)):
                log.warning("rolling back a prepare or unprepare cut short")
                await self._undo(record)
            await self._release(claim)

    async def _remove_unowned(
        self,
        claim_uids: set[str],
        remove: Callable[[str], Awaitable[None]],
        owns: Callable[[ClaimRecord], bool] = lambda _record: True,
    ) -> None:
        """Runtime state (specs, directories, daemons) of claims whose record does not own it.
        Each is checked again under the claim's lock: a peer may be preparing the claim now."""
        for uid in claim_uids:
            seen = self._records_seen.get(uid)
            if seen is not None and owns(seen):
                continue
            async with self._claim_locks.hold(uid):
                record = self._records.read(uid)
                if record is None or not owns(record):
                    await remove(uid)

    async def _remove_unowned_spec(self, claim_uid: str) -> None:
        log.info("removing CDI spec no prepared claim owns", path=str(self._cdi_specs.path_for(claim_uid)))
        self._cdi_specs.remove(claim_uid)

    async def _remove_hami_core_directory(self, claim_uid: str) -> None:
        assert self._hami_core is not None
        await asyncio.to_thread(remove_claim_directory, self._hami_core, claim_uid)

    async def _check_mps_daemons(self) -> None:
        """Daemons no prepared claim owns are stopped; a prepared claim whose daemon died (the
        agent's container was restarted with it) is reported: its pods must be restarted."""
        if self._sharing is None:
            return
        mps = self._sharing.mps
        await self._remove_unowned(mps.claim_uids(), self._stop_unowned_daemon, lambda record: record.mps)
        for record in self.prepared_claims.values():
            if record.mps and not await mps.is_running(record.claim.uid):
                log.error(
                    "the MPS daemon of a prepared claim is gone; restart the claim's pods",
                    claim_namespace=record.claim.namespace,
                    claim_name=record.claim.name,
                    claim_uid=record.claim.uid,
                )

    async def _stop_unowned_daemon(self, claim_uid: str) -> None:
        assert self._sharing is not None
        log.info("stopping an MPS daemon no prepared claim owns", claim_uid=claim_uid)
        await self._sharing.mps.stop(claim_uid)

    def _refresh_view(self, turn: StateTurn) -> None:
        """Catches up with the records on disk and the shared table, which a peer process may have
        changed. Reservations are judged before the records are read: one whose prepare finished
        meanwhile is then found by its record."""
        self._reservations = ReservationTable(filter(self._under_way, self._shared_table(turn)))
        self._records_seen = self._records.read_all()
        for reservation in self._reservations:
            self._records_seen.setdefault(reservation.claim.uid, _reservation_record(reservation))
        self._owner_of_device = {}
        for record in self._records_seen.values():
            self._take_devices(record)

    def _shared_table(self, turn: StateTurn) -> ReservationTable:
        try:
            return decode_table(turn.table())
        except ValueError as error:
            # Only a foreign write can do this; the records on disk still hold every prepared claim.
            log.error("the state lock file's reservation table is unreadable; ignoring it", reason=str(error))
            return ReservationTable()

    def _under_way(self, reservation: Reservation) -> bool:
        """Whether the prepare that made `reservation` still runs (its claim lock is held)."""
        if reservation.owner == self._owner_token:
            return reservation.claim.uid in self._reserving
        return self._claim_locks.held_elsewhere(reservation.claim.uid)

    def _take_devices(self, record: ClaimRecord) -> None:
        for key in record.exclusive_keys:
            holder = self._owner_of_device.setdefault(key, record.claim)
            if holder != record.claim:
                log.error(
                    "two prepared claims hold one device",
                    device=key,
                    claim_namespace=record.claim.namespace,
                    claim_name=record.claim.name,
                    claim_uid=record.claim.uid,
                    other_claim=str(holder),
                )

    async def _release(self, claim: ClaimRef) -> None:
        """Gives up the claim's devices, after its record is gone from disk."""
        async with self._state_lock.hold() as turn:
            self._reserving.discard(claim.uid)
            if turn.stale:
                self._refresh_view(turn)
            else:
                self._records_seen.pop(claim.uid, None)
                for key in [key for key, holder in self._owner_of_device.items() if holder == claim]:
                    del self._owner_of_device[key]
            self._reservations.discard(claim.uid)
            turn.changed(self._reservations.encoded())

    @property
    def prepared_claims(self) -> dict[str, ClaimRecord]:
        """Claims prepared on this node, by this process or a peer, as of the last turn."""
        return {uid: record for uid, record in self._records_seen.items() if record.state == "prepared"}

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self._cdi_specs.path_for(claim_uid)

    # -- prepare -------------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[RawClaim]) -> dict[str, PrepareOutcome]:
        gate = CallGate(len(claims)) if len(claims) > 1 else None
        calls = [self._prepare_one(raw, None if gate is None else gate.ticket()) for raw in claims]
        outcomes = await _to_the_end(_concurrently(calls))
        return {raw[2]: outcome for raw, outcome in zip(claims, outcomes, strict=True)}

    async def _prepare_one(self, raw: RawClaim, ticket: GateTicket | None) -> PrepareOutcome:
        with _claim_context(raw), self._metrics.prepare_duration.time():
            try:
                return await self._prepare_checked(raw, ticket)
            finally:
                if ticket is not None:
                    ticket.leave()  # nothing if the claim arrived with its record

    async def _prepare_checked(self, raw: RawClaim, ticket: GateTicket | None) -> PrepareOutcome:
        try:
            ref = claim_ref(*raw)
            # The claim's lock is held from the GET on: an unprepare that arrives meanwhile waits,
            # and so can never be overtaken by a prepare that started before it.
            async with self._claim_locks.hold(ref.uid):
                claim = await self._source.get(ref.namespace, ref.name)
                allocated = allocated_devices(claim, ref, self._driver_name)
                entries = config_entries(claim)
                record = await self._finished_record(ref)
                if record is None:
                    planned = plan_claim(
                        ref, allocated, entries, self._inventory, self._driver_name, self._pool_name
                    )
                    record = await self._prepare_new(ref, planned, ticket)
            return PrepareOutcome(devices=record.devices)
        except Exception as error:
            self._metrics.prepare_failed(error)
            return PrepareOutcome(error=_log_failure("prepare", raw, error))

    async def _finished_record(self, ref: ClaimRef) -> ClaimRecord | None:
        """The claim's prepared record on disk, if any. A "preparing" one under the claim's lock
        was left by a peer process that died part-way: it is rolled back first."""
        record = self._records.read(ref.uid)
        if record is None or record.state == "prepared":
            return record
        log.warning("rolling back a prepare or unprepare that another agent process left unfinished")
        await self._undo(record)
        await self._release(ref)
        return None

    async def _reserve(self, ref: ClaimRef, keys: tuple[str, ...]) -> None:
        """Checks and takes ownership in one node-wide turn, with a reservation in the shared table
        that shows every agent process on the node the devices taken."""
        if not keys:
            return
        async with self._state_lock.hold() as turn:
            if turn.stale:
                self._refresh_view(turn)
            holder = self._other_holder(ref, keys)
            if holder is not None and not turn.stale and self._is_peer_reservation(holder[1]):
                # The peer's prepare may have ended since this process last looked: look again
                # (a view refreshed in this very turn is as fresh as a second look would be).
                self._refresh_view(turn)
                holder = self._other_holder(ref, keys)
            if holder is not None:
                key, other = holder
                raise ClaimRejected(
                    f"claim {ref}: device {key} is already prepared for claim {other}; "
                    "it is exclusive and can serve one claim at a time"
                )
            reservation = Reservation(claim=ref, devices=keys, owner=self._owner_token)
            self._reservations.add(reservation)
            self._reserving.add(ref.uid)
            turn.changed(self._reservations.encoded())
            self._records_seen[ref.uid] = _reservation_record(reservation)
            for key in keys:
                self._owner_of_device[key] = ref

    def _other_holder(self, ref: ClaimRef, keys: tuple[str, ...]) -> tuple[str, ClaimRef] | None:
        for key in keys:
            holder = self._owner_of_device.get(key)
            if holder is not None and holder != ref:
                return key, holder
        return None

    def _is_peer_reservation(self, claim: ClaimRef) -> bool:
        reservation = self._reservations.get(claim.uid)
        return reservation is not None and reservation.owner != self._owner_token

    def _reservation_fulfilled(self, claim_uid: str) -> None:
        """The claim's record now holds its devices. Its reservation leaves this process's table
        now and the shared one with the next change written; until then peers see it ended (the
        claim lock is free) and go by the record."""
        self._reserving.discard(claim_uid)
        self._reservations.discard(claim_uid)

    async def _prepare_new(
        self, ref: ClaimRef, planned: tuple[PlannedDevice, ...], ticket: GateTicket | None
    ) -> ClaimRecord:
        if not planned:
            return ClaimRecord(claim=ref, devices=())  # nothing of ours in this claim
        keys = tuple(key for device in planned if (key := device.exclusive_key))
        await self._reserve(ref, keys)
        to_create = tuple(device.create_mig for device in planned if device.create_mig)
        preparing = ClaimRecord(
            claim=ref, devices=(), state="preparing", mig_instances=to_create, reserved=keys
        )
        try:
            if to_create:
                await self._records.write(preparing)
                failpoints.reached("prepare.preparing-recorded")
            created = await self._create_mig_instances(ref, to_create)
            sharing = self._sharing_plan(ref, planned, created)
            if sharing.time_slices or sharing.mps:
                preparing = replace(
                    preparing,
                    time_sliced_gpus=tuple(change.gpu_uuid for change in sharing.time_slices),
                    mps=sharing.mps is not None,
                )
                await self._records.write(preparing)
                await self._apply_sharing(ref, sharing)
            vgpu = await self._vgpu_edits(ref, planned)
            claim_devices = [(d.cdi_name, self._edits_for(d, created, vgpu)) for d in planned]
            if sharing.mps:
                claim_devices.append((MPS_CDI_DEVICE, sharing.container_edits))
            spec = cdi.claim_spec(self._driver_name, ref.uid, claim_devices)
            record = replace(
                self._prepared_record(ref, planned, spec, to_create),
                time_sliced_gpus=preparing.time_sliced_gpus,
                mps=preparing.mps,
            )
            await self._write_prepared(
                ref, spec, record, first_record=not preparing.has_side_effects, ticket=ticket
            )
        except BaseException:
            await self._undo(preparing)
            await self._release(ref)
            raise
        self._records_seen[ref.uid] = record
        self._reservation_fulfilled(ref.uid)
        log.info(
            "claim prepared",
            pool=self._pool_name,
            devices=[d.device for d in record.devices],
            mig_instances_created=len(to_create),
        )
        return record

    async def _create_mig_instances(
        self, ref: ClaimRef, wanted: tuple[MigInstanceRecord, ...]
    ) -> dict[MigInstanceRecord, MigInstance]:
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
                raise ClaimRejected(f"claim {ref}: cannot create its MIG instance: {error}") from error
        return created

    async def _vgpu_edits(self, ref: ClaimRef, planned: tuple[PlannedDevice, ...]) -> ContainerEdits:
        """The HAMi-core limits every container of the claim gets with its vGPU devices, in the
        order CUDA enumerates them; with HAMi-core configured, also the library, the preload file
        and the claim's shared directory, created on the host here."""
        shares = [
            vgpu_share(
                {"consumedCapacity": dict(d.result.consumed_capacity), "shareID": d.result.share_id},
                d.result.position,
                d.device,
                d.gpu,
                d.config if isinstance(d.config, VgpuConfig) else VgpuConfig(),
            )
            for d in planned
            if d.device.type == "vgpu" and not d.result.admin_access
        ]
        if not shares:
            return ContainerEdits()
        claim_edits = vgpu_claim_edits(ref.uid, shares, self._hami_core)
        await asyncio.to_thread(create_host_entries, claim_edits.host_entries)
        return claim_edits.edits

    def _edits_for(
        self, device: PlannedDevice, created: dict[MigInstanceRecord, MigInstance], vgpu: ContainerEdits
    ) -> ContainerEdits:
        instance = created[device.create_mig] if device.create_mig else device.existing_mig
        if device.device.type == "mig" and device.result.admin_access:
            return self._edits.mig_monitor(device.name, device.gpu)
        if device.device.type == "mig" and instance is not None:
            return self._edits.mig(device.name, device.gpu, instance)
        edits = self._edits.gpu(device.name, device.gpu)
        shared = device.device.type == "vgpu" and not device.result.admin_access
        return edits.plus(vgpu) if shared else edits

    def _prepared_record(
        self,
        ref: ClaimRef,
        planned: tuple[PlannedDevice, ...],
        spec: CdiSpec,
        mig_instances: tuple[MigInstanceRecord, ...],
    ) -> ClaimRecord:
        # claim_spec keeps the order of its input: one CDI device per planned device, then the
        # claim-wide ones (MPS) that every device of the claim needs.
        claim_wide = tuple(spec.qualified_name(extra) for extra in spec.devices[len(planned) :])
        return ClaimRecord(
            claim=ref,
            devices=tuple(
                PreparedDevice(
                    request_names=(device.result.main_request,),
                    pool=device.result.pool,
                    device=device.result.device,
                    cdi_device_ids=(spec.qualified_name(cdi_device), *claim_wide, *self._common_cdi_ids),
                    exclusive_key=device.exclusive_key,
                    share_id=device.result.share_id,
                )
                for device, cdi_device in zip(planned, spec.devices[: len(planned)], strict=True)
            ),
            mig_instances=mig_instances,
        )

    async def _write_prepared(
        self,
        ref: ClaimRef,
        spec: CdiSpec,
        record: ClaimRecord,
        *,
        first_record: bool,
        ticket: GateTicket | None,
    ) -> None:
        """`first_record`: no "preparing" record was written (nothing had side effects), so the
        claim has no record file yet: the one written now is created, not replaced. `ticket`: the
        claim's passage through its call's gate (see call_gate), None for a call of one claim."""
        self._cdi_specs.write(ref.uid, spec)
        failpoints.reached("prepare.cdi-written")
        if ticket is not None:
            await ticket.arrive()
        if first_record:
            await self._records.create(record)
        else:
            await self._records.write(record)
        failpoints.reached("prepare.prepared-recorded")

    async def _undo(self, record: ClaimRecord) -> None:
        """Removes every side effect `record` names, then the record: each step is safe to repeat,
        so a crash in the middle of undoing is finished by the next start."""
        await self._undo_side_effects(record)
        self._cdi_specs.remove(record.claim.uid)
        await self._records.erase(record.claim.uid)

    def _sharing_plan(
        self, ref: ClaimRef, planned: tuple[PlannedDevice, ...], created: dict[MigInstanceRecord, MigInstance]
    ) -> SharingPlan:
        if self._sharing is None:
            return SharingPlan()
        shared = []
        for device in planned:
            if device.result.admin_access:
                continue
            instance = created[device.create_mig] if device.create_mig else device.existing_mig
            shared.append(
                SharedDevice(
                    name=device.name,
                    type=device.device.type,
                    gpu_uuid=device.gpu.uuid,
                    sharing=device.config.sharing,
                    mig_uuid=instance.uuid if device.device.type == "mig" and instance else None,
                )
            )
        return plan_sharing(ref.uid, shared, self._sharing.mps.runtime_dir)

    async def _apply_sharing(self, ref: ClaimRef, plan: SharingPlan) -> None:
        if self._sharing is None:
            return
        try:
            for change in plan.time_slices:
                await self._sharing.time_slicer.set_time_slice(change.gpu_uuid, change.interval)
            if plan.mps:
                await self._sharing.mps.start(plan.mps)
        except HardwareError as error:
            raise ClaimRejected(f"claim {ref}: cannot set up GPU sharing: {error}") from error

    async def _undo_side_effects(self, record: ClaimRecord) -> None:
        """MPS daemon first (its clients lose the GPU either way), then time slices, then MIG,
        then the claim's HAMi-core directory."""
        if self._sharing is not None:
            if record.mps:
                await self._sharing.mps.stop(record.claim.uid)
            for gpu_uuid in record.time_sliced_gpus:
                await self._sharing.time_slicer.set_time_slice(gpu_uuid, "Default")
        await self._destroy_mig_instances(record.mig_instances)
        if self._hami_core is not None:
            await asyncio.to_thread(remove_claim_directory, self._hami_core, record.claim.uid)

    def _mig_device_name(self, record: MigInstanceRecord) -> str:
        """The published device a MIG instance stands for, for log lines."""
        name = self._inventory.dynamic_mig_name(record.gpu_uuid, record.profile_id, record.placement_start)
        return name or f"{record.gpu_uuid} profile {record.profile_id} at slice {record.placement_start}"

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

    # -- unprepare -----------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[RawClaim]) -> dict[str, str]:
        """Undoes prepare from local records alone; a claim we never prepared succeeds."""
        errors = await _to_the_end(_concurrently([self._unprepare_one(raw) for raw in claims]))
        return {raw[2]: error for raw, error in zip(claims, errors, strict=True)}

    async def _unprepare_one(self, raw: RawClaim) -> str:
        with _claim_context(raw), self._metrics.unprepare_duration.time():
            return await self._unprepare_checked(raw)

    async def _unprepare_checked(self, raw: RawClaim) -> str:
        try:
            ref = claim_ref(*raw)
            async with self._claim_locks.hold(ref.uid):
                record = self._records.read(ref.uid)
                if record is None:
                    # A crash between writing the spec and the record leaves a spec nobody owns.
                    self._cdi_specs.remove(ref.uid)
                    return ""
                if record.has_side_effects:
                    # From here on the claim's side effects are in doubt: a crash before the end
                    # leaves a record the next start rolls back, never one that looks prepared.
                    await self._records.write(replace(record, state="preparing"))
                await self._undo_side_effects(record)
                await self._remove_prepared(ref.uid)
                await self._release(record.claim)
            log.info("claim unprepared")
            return ""
        except Exception as error:
            self._metrics.unprepare_failed(error)
            return _log_failure("unprepare", raw, error)

    async def _remove_prepared(self, claim_uid: str) -> None:
        # The record goes first: a crash in between leaves a spec no record owns, which the next
        # start (or an unprepare of the unknown claim) removes. The other way round would leave a
        # record that answers a re-prepare with CDI IDs whose spec is gone.
        await self._records.erase(claim_uid)
        failpoints.reached("unprepare.record-deleted")
        self._cdi_specs.remove(claim_uid)
        failpoints.reached("unprepare.cdi-removed")


def _reservation_record(reservation: Reservation) -> ClaimRecord:
    """A reservation as the view holds it: the record its prepare will replace."""
    return ClaimRecord(claim=reservation.claim, devices=(), state="preparing", reserved=reservation.devices)


def _placement(instance: MigInstanceRecord) -> Placement:
    return Placement(instance.placement_start, instance.placement_size)
