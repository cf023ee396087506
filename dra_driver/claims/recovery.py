"""Start-up: making the node agree with the claim records again after whatever ended the last run.

Three things can be out of step when an agent starts. The node rebooted: every record describes
MIG instances and CDI specs that are gone, so the records are dropped and kubelet prepares its
pods' claims again. A prepare or unprepare was cut short (a "preparing" record): it is rolled
back. Runtime state exists that no record owns (a crash between creating it and recording it,
or between removing the record and removing it): it is removed, CDI specs and device metadata
files among it, and so is the MPS daemon of a GPU no vGPU share's record names.

A peer agent (the other pod of a rolling update) may be working at the same time, so each claim
is looked at again under its own lock before anything of it is touched: a peer's prepare under
way holds that lock, and this waits for it and then finds its record finished.
"""

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from dra_driver.claims.calls import RawClaim, claim_context
from dra_driver.claims.claim_state import ClaimState
from dra_driver.claims.record_store import QuarantinedRecord
from dra_driver.claims.records import ClaimRecord

log = structlog.get_logger("dra_driver.claims")


class StartupRecovery:
    def __init__(self, state: ClaimState, roll_back: Callable[[ClaimRecord], Awaitable[None]]) -> None:
        """`roll_back`: the engine's undo of a "preparing" record, called under the claim's lock
        (the order of its steps is the record protocol's, so it stays with the protocol)."""
        self._state = state
        self._roll_back = roll_back

    async def run(self, boot_id: str | None) -> list[QuarantinedRecord]:
        """Returns the records set aside as unreadable, for the caller to report."""
        if boot_id is not None and await asyncio.to_thread(self._state.records.boot_changed, boot_id):
            # No peer can be working on these: one started since the reboot would have recorded
            # the new boot ID already. They are dropped unread: a record written without a flush
            # may have been cut short by the reboot, and is not a corrupt one to report.
            dropped = await asyncio.to_thread(self._state.records.drop_all)
            log.warning("the node rebooted since the last run; prepared claims are forgotten", claims=dropped)
        records, quarantined = await asyncio.to_thread(self._state.records.load_all)
        for uid, record in records.items():
            if record.state == "preparing":
                await self._roll_back_unfinished(uid)
        await self._state.ownership.catch_up()
        await self._remove_unowned(self._state.cdi_specs.claim_uids(), self._remove_unowned_spec)
        await self._remove_unowned(self._state.metadata.claim_uids(), self._remove_unowned_metadata)
        for leftovers in self._state.effects.leftovers():
            await self._remove_unowned(await leftovers.claim_uids(), leftovers.remove, leftovers.owned_by)
        await self._state.effects.at_start(self._state.ownership.prepared_claims)
        return quarantined

    async def _roll_back_unfinished(self, claim_uid: str) -> None:
        async with self._state.claim_locks.hold(claim_uid):
            record = self._state.records.read(claim_uid)
            if record is None or record.state != "preparing":
                return
            claim = record.claim
            with claim_context(RawClaim(claim.namespace, claim.name, claim.uid)):
                log.warning("rolling back a prepare or unprepare cut short")
                await self._roll_back(record)

    async def _remove_unowned(
        self,
        claim_uids: set[str],
        remove: Callable[[str], Awaitable[None]],
        owns: Callable[[ClaimRecord], bool] = lambda _record: True,
    ) -> None:
        """Runtime state (specs, directories, daemons) of claims whose record does not own it.
        Each is checked again under the claim's lock: a peer may be preparing the claim now."""
        for uid in claim_uids:
            seen = self._state.ownership.seen(uid)
            if seen is not None and owns(seen):
                continue
            async with self._state.claim_locks.hold(uid):
                record = self._state.records.read(uid)
                if record is None or not owns(record):
                    await remove(uid)

    async def _remove_unowned_spec(self, claim_uid: str) -> None:
        log.info(
            "removing CDI spec no prepared claim owns", path=str(self._state.cdi_specs.path_for(claim_uid))
        )
        self._state.cdi_specs.remove(claim_uid)

    async def _remove_unowned_metadata(self, claim_uid: str) -> None:
        log.info(
            "removing device metadata files no prepared claim owns",
            directory=str(self._state.metadata.directory),
        )
        self._state.metadata.remove(claim_uid)
