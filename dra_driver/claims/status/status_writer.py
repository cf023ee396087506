"""Writing our `status.devices` entries into prepared claims, in the background.

The status is for people and tools; the pod needs none of it. So the write never stands between
kubelet and its answer: prepare hands the claim over (`submit`) and returns, and a task of this
writer makes the API calls afterwards, retrying with backoff until it is stored, the claim is
gone, or the claim is unprepared (`cancel`, which never waits). Nothing is written on the
prepare's own time, and the first attempt waits a moment (`settle_seconds`) so that it does not
compete with the claims of a burst of pod starts for the event loop and the API server: measured,
a write sent right after each prepare took the benchmark's prepare p50 from about 2.4 to 16-25 ms
(docs/drafts/claim-status.md). A claim unprepared within that moment sends nothing.

The write is a read-modify-write of the status subresource under the resourceVersion read
(`device_status.status_update`): other drivers' entries are kept as read, and a writer that came
in between (the scheduler adding a consumer, another driver) makes ours conflict rather than be
overwritten or overwrite; a conflict re-reads and re-applies at once. An answer lost after the
server stored the write (a timeout, a 5xx after commit) is harmless: the next attempt reads the
entries back and finds nothing to write.

Per claim only the latest submission counts: a new one replaces a pending one. Pending writes
live in memory only, and kubelet does not prepare a prepared claim again after an agent restart,
so the engine submits every prepared claim again at start (from its record, without the claim:
the writer reads it), and again when kubelet repeats a prepare. A status already stored costs
one GET and no PUT ("unchanged"). So that a node with many prepared claims does not send all
their GETs in the same moment after a restart (or after an outage), at most `concurrency`
claims have a call to the API server under way at any time; the others wait their turn.
"""

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import ClaimFault, DriverError, TransientFault
from dra_driver.base.json_object import JsonObject
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.status.device_status import device_status_entries, has_status_facts, status_update
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.errors import ApiError
from dra_driver.observability.metrics import ClaimStatusMetrics

log = structlog.get_logger("dra_driver.claims.status")

# How long after prepare the first attempt waits; containers start meanwhile.
SETTLE_SECONDS = 1.0
# Claims with a call to the API server under way at once (their other writes wait their turn).
CONCURRENCY = 4
# Conflicts re-read at once this often in a row, then wait like any other failure.
IMMEDIATE_CONFLICT_RETRIES = 3
# Doubling from 0.5 s up to a minute, each wait within +-20 % so that the writes of many claims
# after one outage do not retry in step.
RETRY = Backoff(first=0.5, cap=60.0, jitter=0.2)


# The entries to write, built when the write starts (off the prepare's time) at that time.
EntryBuilder = Callable[[str], tuple[JsonObject, ...]]


def _rfc3339_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ended_by(error: DriverError) -> tuple[str, str] | None:
    """The result and the log line of a failure after which the write is given up; None: it is
    tried again. Chosen by branch, as every retry is (base/errors.py): a TransientFault (no
    answer, a conflict, 5xx) is tried again; a claim gone or, as read now, not decodable (a
    ClaimFault: not the claim prepare decoded), or a write the API server refuses (FinalApiError:
    RBAC, a field it rejects), gets the same answer at every try."""
    if isinstance(error, ApiError) and error.not_found:
        return "dropped", "claim status not written: the claim is gone"
    if isinstance(error, ClaimFault):
        return "dropped", "claim status not written: the claim as read cannot be decoded"
    if not isinstance(error, TransientFault):
        return "rejected", "claim status not written: the API server refused it"
    return None


class ClaimStatusWriter:
    """A timer per claim while its write settles, then a task while it runs; see the module
    docstring. The task is made only when the timer fires: the claims unprepared within the
    settling moment (every one in a loop of prepares and unprepares) cost a timer set and
    cancelled, not a task started, cancelled and finished (issue 31)."""

    def __init__(
        self,
        api: ClaimApi,
        driver_name: str,
        metrics: ClaimStatusMetrics | None = None,
        backoff: Backoff = RETRY,
        settle_seconds: float = SETTLE_SECONDS,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self._api = api
        self._turns = asyncio.Semaphore(concurrency)
        self._settle_seconds = settle_seconds
        self._driver_name = driver_name
        self._metrics = metrics or ClaimStatusMetrics()
        self._dropped = self._metrics.writes.labels(result="dropped")
        self._backoff = backoff
        # Per claim UID: the settling timer, or the task writing.
        self._pending: dict[str, asyncio.TimerHandle | asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> frozenset[str]:
        """UIDs of the claims whose write is not finished."""
        return frozenset(self._pending)

    def submit(self, ref: ClaimRef, claim: ResourceClaimView | None, entries: EntryBuilder) -> None:
        """Queues the write of `entries` into `claim` (as prepare read it; None: read it first);
        returns at once."""
        self.cancel(ref.uid)
        self._pending[ref.uid] = asyncio.get_running_loop().call_later(
            self._settle_seconds, self._start, ref, claim, entries
        )
        self._idle.clear()
        self._metrics.pending.set(len(self._pending))

    def report(
        self,
        driver_name: str,
        ref: ClaimRef,
        claim: ResourceClaimView | None,
        record: ClaimRecord,
        *,
        unless_pending: bool = False,
    ) -> None:
        """Queues the status.devices write of a prepared claim: nothing is sent before kubelet
        has its answer, and nothing that happens to the write changes that answer. `claim`: as
        prepare read it (None: the writer reads it). `unless_pending`: a write already queued
        for the claim stands (it writes the same entries)."""
        if not record.devices or (unless_pending and ref.uid in self.pending):
            return
        if not has_status_facts(record):
            log.info(
                "claim status not written: the claim was prepared by an agent that kept no device "
                "facts in its record",
                claim_namespace=ref.namespace,
                claim_name=ref.name,
                claim_uid=ref.uid,
            )
            return

        def entries(now: str) -> tuple[JsonObject, ...]:  # run by the writer, after the answer
            return device_status_entries(driver_name, record, now=now)

        self.submit(ref, claim, entries)

    def cancel(self, claim_uid: str) -> None:
        """Drops the claim's pending write, if any, without waiting for it."""
        pending = self._pending.pop(claim_uid, None)
        if pending is not None:
            pending.cancel()
            self._dropped.inc()
            self._pending_changed()

    async def wait_idle(self) -> None:
        """Until no write is pending (tests, and a graceful stop that may wait), those of a
        prepare answered just now included: the engine queues them one loop turn after its
        answer (calls.AfterAnswer), which this lets pass first."""
        await asyncio.sleep(0)
        await self._idle.wait()

    async def close(self) -> None:
        tasks = [pending for pending in self._pending.values() if isinstance(pending, asyncio.Task)]
        for uid in tuple(self._pending):
            self.cancel(uid)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, ref: ClaimRef, claim: ResourceClaimView | None, entries: EntryBuilder) -> None:
        task = asyncio.get_running_loop().create_task(
            self._write(ref, claim, entries), name=f"claim-status-{ref.uid}"
        )
        self._pending[ref.uid] = task
        task.add_done_callback(lambda done: self._finished(ref.uid, done))

    def _finished(self, claim_uid: str, task: "asyncio.Task[None]") -> None:
        if self._pending.get(claim_uid) is task:
            del self._pending[claim_uid]
            self._pending_changed()

    def _pending_changed(self) -> None:
        self._metrics.pending.set(len(self._pending))
        if not self._pending:
            self._idle.set()

    def _count(self, result: str) -> None:
        self._metrics.writes.labels(result=result).inc()

    async def _write(self, ref: ClaimRef, claim: ResourceClaimView | None, entries: EntryBuilder) -> None:
        bound = log.bind(claim=str(ref))
        try:
            ours = entries(_rfc3339_now())
        except Exception as error:  # StatusTooLarge, or a fact prepare had and the status cannot say
            bound.error("claim status not written: its entries cannot be built", error=str(error))
            self._count("rejected")
            return
        failures = conflicts = 0
        current = claim
        while True:
            try:
                async with self._turns:
                    if current is None:
                        current = ResourceClaimView.decode(
                            await self._api.get(ref.namespace, ref.name), self._driver_name
                        )
                    update = status_update(current, ref.uid, self._driver_name, ours)
                    if update.body is not None:
                        await self._api.replace_status(ref.namespace, ref.name, update.body)
                if update.body is not None:
                    self._count("written")
                    bound.debug("claim status written", devices=len(ours))
                elif update.outcome == "gone":
                    self._count("dropped")
                    bound.info("claim status not written: the claim no longer holds these devices")
                else:
                    self._count("unchanged")
                return
            except DriverError as error:
                current = None
                ended = _ended_by(error)
                if ended is not None:
                    result, why = ended
                    self._count(result)
                    (bound.error if result == "rejected" else bound.info)(why, error=str(error))
                    return
                if isinstance(error, ApiError) and error.conflict:
                    self._count("conflict")
                    conflicts += 1
                    if conflicts <= IMMEDIATE_CONFLICT_RETRIES:
                        continue
                else:
                    self._count("failed")
                conflicts = 0
                failures += 1
                delay = self._backoff.delay(failures)
                bound.warning(
                    "claim status write failed; retrying", error=str(error), retry_in=round(delay, 2)
                )
                await asyncio.sleep(delay)
