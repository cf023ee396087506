"""Prepare and unprepare: the claim engine behind both DRAPlugin versions.

Every claim of a call is handled concurrently and answered on its own: a bad claim yields an
error for that claim only, never a failed call. Device ownership is checked and taken without
yielding to the event loop, so two overlapping calls can never both get the same GPU, and
kubelet is answered only once the claim's record is on disk.
"""

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from dra_driver.claims import cdi
from dra_driver.claims.allocation import AllocatedDevice, ClaimRejected, allocated_devices
from dra_driver.claims.cdi import CdiSpec, CdiSpecDirectory, ContainerEdits, InvalidCdiName
from dra_driver.claims.identity import ClaimRef, InvalidClaimIdentity, claim_ref
from dra_driver.claims.keyed_locks import KeyedLocks
from dra_driver.claims.records import ClaimRecord, ClaimRecordStore, PreparedDevice, QuarantinedRecord
from dra_driver.claims.source import ClaimSource
from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.model import Gpu

log = structlog.get_logger("dra_driver.claims")

EditsForGpu = Callable[[str, Gpu], ContainerEdits]
# (namespace, name, uid) exactly as kubelet sent them: untrusted until checked.
RawClaim = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


_EXPECTED_FAILURES = (InvalidClaimIdentity, ClaimRejected, InvalidCdiName)


def _log_failure(action: str, raw: RawClaim, error: Exception) -> str:
    namespace, name, uid = raw
    bound = log.bind(claim_namespace=namespace[:80], claim_name=name[:80], claim_uid=uid[:80])
    if isinstance(error, _EXPECTED_FAILURES):
        bound.warning(f"{action} refused", reason=str(error))
        return str(error)
    bound.exception(f"{action} failed unexpectedly")
    return f"internal error during {action}: {type(error).__name__}: {error}"


class ClaimEngine:
    def __init__(
        self,
        *,
        driver_name: str,
        pool_name: str,
        inventory: Inventory,
        edits_for_gpu: EditsForGpu,
        claim_source: ClaimSource,
        records: ClaimRecordStore,
        cdi_specs: CdiSpecDirectory,
    ) -> None:
        self._driver_name = driver_name
        self._pool_name = pool_name
        self._inventory = inventory
        self._edits_for_gpu = edits_for_gpu
        self._source = claim_source
        self._records = records
        self._cdi_specs = cdi_specs
        self._prepared: dict[str, ClaimRecord] = {}
        self._owner_of_device: dict[str, ClaimRef] = {}
        self._claim_locks = KeyedLocks()

    def use_inventory(self, inventory: Inventory) -> None:
        """Devices published from now on (after a fallback to modes the API server supports);
        claims already prepared keep what they were prepared with."""
        self._inventory = inventory

    # -- state ---------------------------------------------------------------------------------

    async def load_state(self) -> list[QuarantinedRecord]:
        """Reads the records left by earlier runs; removes CDI specs that no record owns."""
        records, quarantined = await asyncio.to_thread(self._records.load_all)
        for record in records.values():
            self._take_devices(record)
        self._prepared.update(records)
        await asyncio.to_thread(self._remove_unowned_specs, set(records))
        return quarantined

    def _remove_unowned_specs(self, owned_uids: set[str]) -> None:
        for uid in self._cdi_specs.claim_uids() - owned_uids:
            log.info("removing CDI spec no prepared claim owns", path=str(self._cdi_specs.path_for(uid)))
            self._cdi_specs.remove(uid)

    def _take_devices(self, record: ClaimRecord) -> None:
        for device in record.devices:
            holder = self._owner_of_device.setdefault(device.device, record.claim)
            if holder != record.claim:
                log.error(
                    "two prepared claims hold one device",
                    device=device.device,
                    claim=str(record.claim),
                    other_claim=str(holder),
                )

    def _release_devices(self, claim: ClaimRef) -> None:
        for name in [name for name, holder in self._owner_of_device.items() if holder == claim]:
            del self._owner_of_device[name]

    @property
    def prepared_claims(self) -> dict[str, ClaimRecord]:
        return dict(self._prepared)

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self._cdi_specs.path_for(claim_uid)

    # -- prepare -------------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[RawClaim]) -> dict[str, PrepareOutcome]:
        # Shielded: if kubelet gives up on the call (deadline, dropped connection), the work still
        # runs to the end, so memory and disk agree and kubelet's retry finds the claim prepared.
        outcomes = await asyncio.shield(asyncio.gather(*(self._prepare_one(raw) for raw in claims)))
        return {raw[2]: outcome for raw, outcome in zip(claims, outcomes, strict=True)}

    async def _prepare_one(self, raw: RawClaim) -> PrepareOutcome:
        try:
            ref = claim_ref(*raw)
            claim = await self._source.get(ref.namespace, ref.name)
            allocated = allocated_devices(claim, ref, self._driver_name)
            async with self._claim_locks.hold(ref.uid):
                record = self._prepared.get(ref.uid) or await self._prepare_new(ref, allocated)
            return PrepareOutcome(devices=record.devices)
        except Exception as error:
            return PrepareOutcome(error=_log_failure("prepare", raw, error))

    def _gpus_for(self, ref: ClaimRef, allocated: tuple[AllocatedDevice, ...]) -> dict[str, Gpu]:
        gpus = {}
        for result in allocated:
            if result.pool != self._pool_name:
                raise ClaimRejected(
                    f"claim {ref}: device {result.device} was allocated from pool {result.pool!r}, "
                    f"but this node serves pool {self._pool_name!r}"
                )
            device = self._inventory.device_by_name.get(result.device)
            if device is None:
                raise ClaimRejected(f"claim {ref}: device {result.device!r} does not exist on this node")
            if device.type != "gpu":
                raise ClaimRejected(
                    f"claim {ref}: device {result.device!r} is a {device.type} device; this version of "
                    "the driver prepares whole GPUs only"
                )
            gpus[result.device] = self._inventory.gpu_of_device[result.device]
        return gpus

    def _reserve(self, ref: ClaimRef, device_names: list[str]) -> None:
        """Checks and takes ownership in one step: no await, so no other call can interleave."""
        for name in device_names:
            holder = self._owner_of_device.get(name)
            if holder is not None and holder != ref:
                raise ClaimRejected(
                    f"claim {ref}: device {name} is already prepared for claim {holder}; "
                    "it is exclusive and can serve one claim at a time"
                )
        for name in device_names:
            self._owner_of_device[name] = ref

    async def _prepare_new(self, ref: ClaimRef, allocated: tuple[AllocatedDevice, ...]) -> ClaimRecord:
        gpus = self._gpus_for(ref, allocated)
        names = sorted(gpus)
        spec = cdi.claim_spec(
            self._driver_name, ref.uid, [(name, self._edits_for_gpu(name, gpus[name])) for name in names]
        )
        # claim_spec keeps the order of its input: one CDI device per name.
        cdi_id_of = {
            name: spec.qualified_name(device) for name, device in zip(names, spec.devices, strict=True)
        }
        record = ClaimRecord(
            claim=ref,
            devices=tuple(
                PreparedDevice(
                    request_names=(result.main_request,),
                    pool=result.pool,
                    device=result.device,
                    cdi_device_ids=(cdi_id_of[result.device],),
                )
                for result in allocated
            ),
        )
        if not record.devices:
            return record  # nothing of ours in this claim: nothing to do or to remember
        self._reserve(ref, names)
        try:
            await asyncio.to_thread(self._write_prepared, ref, spec, record)
        except BaseException:
            self._release_devices(ref)
            await asyncio.to_thread(self._cdi_specs.remove, ref.uid)
            raise
        self._prepared[ref.uid] = record
        log.info(
            "claim prepared",
            claim_namespace=ref.namespace,
            claim_name=ref.name,
            claim_uid=ref.uid,
            devices=[d.device for d in record.devices],
        )
        return record

    def _write_prepared(self, ref: ClaimRef, spec: CdiSpec, record: ClaimRecord) -> None:
        self._cdi_specs.write(ref.uid, spec)
        self._records.save(record)

    # -- unprepare -----------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[RawClaim]) -> dict[str, str]:
        """Undoes prepare from local records alone; a claim we never prepared succeeds."""
        errors = await asyncio.shield(asyncio.gather(*(self._unprepare_one(raw) for raw in claims)))
        return {raw[2]: error for raw, error in zip(claims, errors, strict=True)}

    async def _unprepare_one(self, raw: RawClaim) -> str:
        try:
            ref = claim_ref(*raw)
            async with self._claim_locks.hold(ref.uid):
                record = self._prepared.get(ref.uid)
                if record is None:
                    # A crash between writing the spec and the record leaves a spec nobody owns.
                    await asyncio.to_thread(self._cdi_specs.remove, ref.uid)
                    return ""
                await asyncio.to_thread(self._remove_prepared, ref.uid)
                del self._prepared[ref.uid]
                self._release_devices(record.claim)
            log.info(
                "claim unprepared", claim_namespace=ref.namespace, claim_name=ref.name, claim_uid=ref.uid
            )
            return ""
        except Exception as error:
            return _log_failure("unprepare", raw, error)

    def _remove_prepared(self, claim_uid: str) -> None:
        # The spec goes first: a crash in between leaves a record, and the next unprepare finishes.
        self._cdi_specs.remove(claim_uid)
        self._records.delete(claim_uid)
