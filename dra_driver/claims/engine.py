"""Prepare and unprepare: the claim engine behind both DRAPlugin versions.

Every claim of a call is handled concurrently and answered on its own: a bad claim yields an
error for that claim only, never a failed call. Device ownership is checked and taken without
yielding to the event loop, so two overlapping calls can never both get the same GPU, and
kubelet is answered only once the claim's record is written (what "written" guarantees, and why
it need not mean flushed: record_store).

The record protocol, which makes a crash at any point recoverable:
- A claim without side effects: its device metadata files and CDI spec are written, then its
  "prepared" record created, then kubelet is answered.
- A claim with side effects (a MIG instance to create, a time slice to set, an MPS daemon to
  start) is prepared in two phases: a "preparing" record naming the side effects is written
  before the first of them, and the "prepared" record before kubelet is answered. A crash in
  between leaves the "preparing" record, and the next start (or the next prepare of the claim)
  undoes what it names.
- Unprepare turns a record with side effects back into "preparing" before undoing any of them,
  then erases the record, then removes the spec and the metadata files.
- Rolling back a "preparing" record undoes its side effects, removes the spec and the metadata
  files and erases the record last, so that a crash while undoing is finished by the next start.
- Metadata files and specs are found by claim UID: any that no record owns (a crash between
  writing them and the record, or between erasing the record and removing them) are removed by
  the next start, or by an unprepare of the claim.

Another agent process may share the state directory (the old and the new pod of a rolling
update), so the records on disk are the truth, not this process's memory: a claim is worked on
under its own lock across processes and its record is read from disk there, and device ownership
is checked and taken in a short node-wide turn that first catches up with any peer's changes.

The jobs around the protocol live next to it: claim_object.py (the claim, decoded once where it
is fetched), claim_plan.py (every reason to refuse it, before any side effect), ownership.py (who
holds which device, agreed with peer agents), side_effects.py and effects/ (doing and undoing
MIG, time slices, MPS, HAMi-core: one module per effect), recovery.py (start-up), unprepare.py
(the undoing), prepared.py (a claim's CDI devices and record), prepared_files.py (writing them),
calls.py (running a call's claims), status_writer.py (the claim's status.devices, written in the
background after the answer).
"""

import asyncio
from collections.abc import Sequence
from pathlib import Path

import msgspec
import structlog
from msgspec.structs import replace

from dra_driver.claims.allocation import allocated_devices
from dra_driver.claims.calls import (
    AfterAnswer,
    RawClaim,
    claim_context,
    failure_answer,
    to_the_end,
)
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.claim_plan import PlannedDevice, plan_claim
from dra_driver.claims.claim_state import ClaimState
from dra_driver.claims.edits import cdi
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.gpu_edits import DeviceEdits
from dra_driver.claims.edits.vgpu_edits import HamiCore
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.effects.contract import EffectRefused
from dra_driver.claims.identity import ClaimRef, claim_ref
from dra_driver.claims.ownership import DeviceOwnership
from dra_driver.claims.prepared import claim_cdi_devices, metadata_devices, prepared_record
from dra_driver.claims.prepared_files import PreparedFiles
from dra_driver.claims.record_store import ClaimRecordStore, QuarantinedRecord
from dra_driver.claims.records import ClaimRecord, PreparedDevice
from dra_driver.claims.recovery import StartupRecovery
from dra_driver.claims.sharing.gpu_mps_daemons import DaemonReport, GpuMpsDaemons
from dra_driver.claims.side_effects import ClaimSideEffects, EffectControls, SharingControls
from dra_driver.claims.source import ClaimSource
from dra_driver.claims.status.device_metadata import (
    mount_edits,
    pod_claim_name,
    request_metadata,
)
from dra_driver.claims.status.metadata_files import DeviceMetadataDirectory
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.claims.unprepare import ClaimUnpreparer
from dra_driver.devices.inventory import Inventory
from dra_driver.observability.metrics import ClaimMetrics
from dra_driver.state import failpoints
from dra_driver.state.change_counters import ChangeCounters
from dra_driver.state.shared_locks import ClaimLocks

__all__ = ["ClaimEngine", "EffectControls", "PrepareOutcome", "RawClaim", "SharingControls"]

log = structlog.get_logger("dra_driver.claims")

# Under the state directory: the change counters of the GPUs' MPS daemon users (gpu_mps_daemons).
GPU_MPS_CHANGES = "gpu-mps-changes"


class PrepareOutcome(msgspec.Struct, frozen=True):
    """One claim's answer: its prepared devices, or why it was not prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimEngine:
    """The node's claims, for kubelet: `load_state` once at start, then `prepare` and `unprepare`,
    which answer every claim of a call on its own and never raise for one."""

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
        controls: EffectControls | None = None,
        common_cdi_ids: tuple[str, ...] = (),
        hami_core: HamiCore | None = None,
        metrics: ClaimMetrics | None = None,
        claim_status: ClaimStatusWriter | None = None,
        on_gpu_daemon: DaemonReport | None = None,
    ) -> None:
        """`controls`: what the side effects act through (None: a node that makes none).
        `common_cdi_ids`: CDI devices every prepared device also needs (the node-wide spec).
        `claim_status`: writes the status.devices of prepared claims (None: not written).
        `on_gpu_daemon`: told, besides the metrics, whether each GPU's MPS daemon answers (the
        device health of its vGPU shares)."""
        controls = controls or EffectControls()
        sharing = controls.sharing
        self._driver_name = driver_name
        self._pool_name = pool_name
        self._inventory = inventory
        self._edits = edits
        self._common_cdi_ids = common_cdi_ids
        self._metrics = metrics or ClaimMetrics()
        self._source = claim_source
        self._records = records
        self._cdi_specs = cdi_specs
        self._claim_status = claim_status
        # Beside the records: the files must outlive a restart of the agent, as the claims do.
        self._metadata = DeviceMetadataDirectory(records.state_dir)
        self._claim_locks = ClaimLocks(records.state_dir / "claim.locks")
        self._ownership = DeviceOwnership(records, self._claim_locks)
        self._on_gpu_daemon = on_gpu_daemon
        self._gpu_mps = (
            None
            if sharing is None
            else GpuMpsDaemons(
                sharing.mps,
                self._claim_locks,
                records.read_all,
                records.write,
                self._gpu_daemon_report,
                ChangeCounters(records.state_dir / GPU_MPS_CHANGES),
            )
        )
        self._effects = ClaimSideEffects(
            pool_name=pool_name,
            inventory=inventory,
            controls=controls,
            hami_core=hami_core,
            gpu_mps=self._gpu_mps,
        )
        self._files = PreparedFiles(records, cdi_specs, self._metadata)
        state = ClaimState(
            records, cdi_specs, self._metadata, self._claim_locks, self._ownership, self._effects
        )
        self._unpreparer = ClaimUnpreparer(state, self._metrics, claim_status)
        self._recovery = StartupRecovery(state, self._roll_back)

    def _gpu_daemon_report(self, gpu_uuid: str, up: bool | None) -> None:
        self._metrics.gpu_mps_daemon(gpu_uuid, up)
        if self._on_gpu_daemon is not None:
            self._on_gpu_daemon(gpu_uuid, up)

    async def probe_gpu_daemons(self) -> None:
        """Reports whether each GPU's MPS daemon with vGPU shares answers (gpu_mps_daemons.probe)."""
        if self._gpu_mps is not None:
            await self._gpu_mps.probe()

    def close(self) -> None:
        self._ownership.close()
        self._claim_locks.close()

    def use_inventory(self, inventory: Inventory) -> None:
        """Devices published from now on (after a fallback to modes the API server supports);
        claims already prepared keep what they were prepared with."""
        self._inventory = inventory
        self._effects.use_inventory(inventory)

    async def load_state(self, boot_id: str | None = None) -> list[QuarantinedRecord]:
        """Recovers from whatever ended the last run (recovery.py); returns the records set aside
        as unreadable. `boot_id`: the node's, to forget every record after a reboot.

        Then the status of every prepared claim is queued for writing (in the background, a few
        claims at a time: status_writer), since the last run may have stopped before it was
        stored; the writer sends nothing for a status that is stored already."""
        quarantined = await self._recovery.run(boot_id)
        for record in self._ownership.prepared_claims.values():
            self._report_status(record.claim, None, record)
        return quarantined

    @property
    def prepared_claims(self) -> dict[str, ClaimRecord]:
        """Claims prepared on this node, by this process or a peer, as of the last turn."""
        return self._ownership.prepared_claims

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self._cdi_specs.path_for(claim_uid)

    # -- prepare -------------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[RawClaim]) -> dict[str, PrepareOutcome]:
        after = AfterAnswer()
        calls = [self._prepare_one(raw, after) for raw in claims]
        outcomes = await to_the_end(asyncio.gather(*calls), after)
        return {raw.uid: outcome for raw, outcome in zip(claims, outcomes, strict=True)}

    async def _prepare_one(self, raw: RawClaim, after: AfterAnswer) -> PrepareOutcome:
        with claim_context(raw), self._metrics.prepare_duration.time():
            return await self._prepare_checked(raw, after)

    async def _prepare_checked(self, raw: RawClaim, after: AfterAnswer) -> PrepareOutcome:
        try:
            ref = claim_ref(*raw)
            # The claim's lock is held from the GET on: an unprepare that arrives meanwhile waits,
            # and so can never be overtaken by a prepare that started before it.
            async with self._claim_locks.hold(ref.uid):
                with self._metrics.claim_get_duration.time():
                    answer = await self._source.get(ref.namespace, ref.name)
                claim = ResourceClaimView.decode(answer, self._driver_name)
                allocated = allocated_devices(claim, ref)
                record = await self._finished_record(ref)
                if record is not None:
                    # Prepared already (kubelet restarted, or a peer agent prepared it): its status
                    # may have been lost with a restart of ours, or removed since.
                    prepared = record
                    after.leave(lambda: self._report_status(ref, claim, prepared, unless_pending=True))
                else:
                    planned = plan_claim(
                        ref, allocated, claim.config, self._inventory, self._driver_name, self._pool_name
                    )
                    record = await self._prepare_new(ref, planned, claim, after)
            return PrepareOutcome(devices=record.devices)
        except Exception as error:
            self._metrics.prepare_failed(error)
            return PrepareOutcome(error=failure_answer("prepare", error))

    async def _finished_record(self, ref: ClaimRef) -> ClaimRecord | None:
        """The claim's prepared record on disk, if any. A "preparing" one under the claim's lock
        was left by a peer process that died part-way: it is rolled back first."""
        record = self._records.read(ref.uid)
        if record is None or record.state == "prepared":
            return record
        log.warning("rolling back a prepare or unprepare that another agent process left unfinished")
        await self._roll_back(record)
        return None

    async def _prepare_new(
        self,
        ref: ClaimRef,
        planned: tuple[PlannedDevice, ...],
        claim: ResourceClaimView,
        after: AfterAnswer,
    ) -> ClaimRecord:
        """`claim`: as read from the API server; it names the pod's claim of a template
        (device_metadata) and the generation the status observes. `after`: where the log line
        and the status write's queueing go, done once kubelet has its answer (so before any
        unprepare of the claim, which kubelet sends only after it)."""
        pod_claim = pod_claim_name(claim, ref)  # refused before anything is done
        if not planned:
            return ClaimRecord(claim=ref, devices=())  # nothing of ours in this claim
        self._effects.check_sharing(planned)  # refused before anything is reserved or created
        # Read before anything is reserved: a GPU to give to a VM refused here holds nothing.
        to_make = await self._effects.claim_actions(ref, planned)
        keys = tuple(key for device in planned if (key := device.exclusive_key))
        await self._ownership.reserve(ref, keys)
        preparing = ClaimRecord(
            claim=ref, devices=(), state="preparing", effects=self._effects.entries(to_make), reserved=keys
        )
        try:
            if to_make:  # phase one: the MIG instances are on record before they exist
                await self._records.write(preparing)
                failpoints.reached("prepare.preparing-recorded")
            created = await self._effects.apply(ref, to_make)
            sharing = self._effects.sharing_plan(ref, planned, created)
            if sharing_actions := await self._effects.sharing_actions(ref, sharing, planned):
                # ... and so is the sharing, before it is set (a HAMi-core directory needs no entry)
                if sharing_entries := self._effects.entries(sharing_actions):
                    preparing = replace(preparing, effects=preparing.effects + sharing_entries)
                    await self._records.write(preparing)
                await self._effects.apply(ref, sharing_actions)
            vgpu = self._effects.vgpu_edits(ref, planned)
            metadata = request_metadata(self._driver_name, ref, pod_claim, metadata_devices(planned, created))
            mounts = [(m.cdi_device, mount_edits(self._metadata.root, ref.uid, m)) for m in metadata]
            handed = self._effects.device_edits(planned)
            devices = claim_cdi_devices(self._edits, planned, created, vgpu, sharing, mounts, handed)
            spec = cdi.claim_spec(self._driver_name, ref.uid, devices)
            record = prepared_record(
                preparing,
                planned,
                created,
                spec,
                self._common_cdi_ids,
                [m.request for m in metadata],
                generation=claim.generation,
            )
            await self._files.write_prepared(  # phase two
                ref, spec, record, metadata, first_record=not preparing.has_side_effects
            )
        except EffectRefused as refused:
            await self._roll_back(preparing.without(refused.not_made))
            raise
        except BaseException:
            await self._roll_back(preparing)
            raise
        self._ownership.fulfilled(record)

        def report() -> None:
            log.info(
                "claim prepared",
                pool=self._pool_name,
                devices=[d.device for d in record.devices],
                mig_instances_created=len(preparing.entries(MigInstanceEntry)),
            )
            self._report_status(ref, claim, record)

        after.leave(report)
        return record

    def _report_status(
        self,
        ref: ClaimRef,
        claim: ResourceClaimView | None,
        record: ClaimRecord,
        *,
        unless_pending: bool = False,
    ) -> None:
        """Queues the claim's status.devices write (status_writer.report) if this node writes them."""
        if self._claim_status is not None:
            self._claim_status.report(self._driver_name, ref, claim, record, unless_pending=unless_pending)

    async def _roll_back(self, record: ClaimRecord) -> None:
        """Undoes a "preparing" record (see the module docstring for the order), then gives up the
        devices it holds. Each step is safe to repeat."""
        await self._effects.undo(record)
        self._cdi_specs.remove(record.claim.uid)
        self._metadata.remove(record.claim.uid)
        await self._records.erase(record.claim.uid)
        await self._ownership.release(record.claim)

    # -- unprepare -----------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[RawClaim]) -> dict[str, str]:
        """Undoes prepare from local records alone (unprepare.py); a claim we never prepared
        succeeds."""
        return await self._unpreparer.unprepare(claims)
