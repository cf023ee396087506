"""Unprepare: undoing a claim's prepare from its local record alone (the engine's other half).

kubelet sends only namespace/name/UID, and the claim may be gone from the API server, so nothing
is fetched: the record names the devices, the side effects and the request files. The order is
the record protocol's (engine.py): a record with side effects turns "preparing" before any is
undone, so a crash part-way leaves a record the next start rolls back, never one that looks
prepared; the record goes before the spec and the metadata files it names.
"""

import asyncio
from collections.abc import Sequence

import structlog
from msgspec.structs import replace

from dra_driver.claims.calls import (
    AfterAnswer,
    RawClaim,
    claim_context,
    failure_answer,
    to_the_end,
)
from dra_driver.claims.claim_state import ClaimState
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.observability.metrics import ClaimMetrics
from dra_driver.state import failpoints

log = structlog.get_logger("dra_driver.claims")


class ClaimUnpreparer:
    def __init__(
        self, state: ClaimState, metrics: ClaimMetrics, claim_status: ClaimStatusWriter | None
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._claim_status = claim_status

    async def unprepare(self, claims: Sequence[RawClaim]) -> dict[str, str]:
        """A claim we never prepared succeeds."""
        after = AfterAnswer()
        errors = await to_the_end(asyncio.gather(*(self._unprepare_one(raw, after) for raw in claims)), after)
        return {raw.uid: error for raw, error in zip(claims, errors, strict=True)}

    async def _unprepare_one(self, raw: RawClaim, after: AfterAnswer) -> str:
        with claim_context(raw), self._metrics.unprepare_duration.time():
            return await self._unprepare_checked(raw, after)

    async def _unprepare_checked(self, raw: RawClaim, after: AfterAnswer) -> str:
        try:
            ref = claim_ref(*raw)
            if self._claim_status is not None:
                self._claim_status.cancel(ref.uid)  # a pending status write is moot now
            async with self._state.claim_locks.hold(ref.uid):
                record = self._state.records.read(ref.uid)
                if record is None:
                    # A crash between writing the spec and the record leaves a spec nobody owns.
                    self._state.cdi_specs.remove(ref.uid)
                    self._state.metadata.remove(ref.uid)
                    return ""
                if record.has_side_effects:
                    # From here on the claim's side effects are in doubt: a crash before the end
                    # leaves a record the next start rolls back, never one that looks prepared.
                    await self._state.records.write(replace(record, state="preparing"))
                await self._state.effects.undo(record)
                await self._remove_prepared(record)
                await self._state.ownership.release(record.claim)
            after.leave(lambda: log.info("claim unprepared"))
            return ""
        except Exception as error:
            self._metrics.unprepare_failed(error)
            return failure_answer("unprepare", error)

    async def _remove_prepared(self, record: ClaimRecord) -> None:
        # The record goes first: a crash in between leaves a spec and metadata files no record
        # owns, which the next start (or an unprepare of the unknown claim) removes. The other way
        # round would leave a record that answers a re-prepare with CDI IDs whose spec is gone.
        claim_uid = record.claim.uid
        await self._state.records.erase(claim_uid)
        failpoints.reached("unprepare.record-deleted")
        self._state.cdi_specs.remove(claim_uid)
        failpoints.reached("unprepare.cdi-removed")
        # The record names the requests, so no search of the directory for the claim's files.
        self._state.metadata.remove(
            claim_uid, {name for device in record.devices for name in device.request_names}
        )
        failpoints.reached("unprepare.metadata-removed")
