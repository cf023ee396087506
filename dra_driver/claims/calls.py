"""How one kubelet call's claims are run: concurrently, each to its end, each answered on its own.

These sit on the pod-startup path (docs/benchmarks.md), which is why they avoid what the general
asyncio tools would add: gather's extra future for a call of one claim, shield's extra loop turn.
"""

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractContextManager
from typing import NamedTuple, TypeVar

import structlog

from dra_driver.base.errors import ClaimFault
from dra_driver.observability.logs import LogContext

log = structlog.get_logger("dra_driver.claims")


class RawClaim(NamedTuple):
    """A claim exactly as kubelet sent it: untrusted until checked (identity.claim_ref)."""

    namespace: str
    name: str
    uid: str


_T = TypeVar("_T")


def claim_context(raw: RawClaim) -> AbstractContextManager[None]:
    """Every log line written while a claim is handled names it (cut short: the values are
    untrusted until checked, and may be huge)."""
    return LogContext(claim_namespace=raw.namespace[:80], claim_name=raw.name[:80], claim_uid=raw.uid[:80])


def failure_answer(action: str, error: Exception) -> str:
    """Logs the failure of `action` for the claim in context, and returns what kubelet is told. A
    ClaimFault is a refusal the claim earned by what it asks for: a warning, answered as it is.
    Anything else is not the claim's doing (ours, the operator's, the moment's): logged with its
    traceback, and answered as an internal error naming its class."""
    if isinstance(error, ClaimFault):
        log.warning(f"{action} refused", reason=str(error))
        return str(error)
    log.exception(f"{action} failed unexpectedly")
    return f"internal error during {action}: {type(error).__name__}: {error}"


async def _alone(call: Awaitable[_T]) -> list[_T]:
    return [await call]


def concurrently(calls: list[Coroutine[object, object, _T]]) -> Awaitable[list[_T]]:
    """The claims of one call, run concurrently. Most calls carry one claim: awaited alone it
    skips gather's extra future and the loop turn its callback takes."""
    return _alone(calls[0]) if len(calls) == 1 else asyncio.gather(*calls)


class AfterAnswer:
    """What a call's claims leave for after kubelet has its answer: work kubelet does not wait
    for (the "claim prepared" log line, queueing the claim's status write) kept off the
    pod-startup path. Each piece runs in the logging context it was left in, so its lines still
    name their claim."""

    def __init__(self) -> None:
        self._work: list[tuple[contextvars.Context, Callable[[], None]]] = []

    def leave(self, work: Callable[[], None]) -> None:
        self._work.append((contextvars.copy_context(), work))

    def __bool__(self) -> bool:
        return bool(self._work)

    def run(self) -> None:
        work, self._work = self._work, []
        for context, piece in work:
            try:
                context.run(piece)
            except Exception as error:  # one piece's fault must not cost the others theirs
                log.error("work left for after an answer failed", error=repr(error))


_unfinished: set["asyncio.Task[None]"] = set()  # asyncio keeps only weak references to tasks


def to_the_end(work: Awaitable[_T], after: AfterAnswer | None = None) -> "asyncio.Future[_T]":
    """Runs `work` to its end even if whoever awaits the answer stops waiting (kubelet's deadline,
    a dropped connection), so memory and disk agree and kubelet's retry finds the claims done.
    What asyncio.shield does, one loop turn sooner: the work sets the answer itself, where
    shield's callback would take a turn to pass it on. `after`: run once the answer is set and
    its waiter has had the loop turn in which it hands gRPC the answer."""
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
        if after:
            # Queued behind the waiter's wake-up, which set_result queued: the waiter hands gRPC
            # the answer first.
            loop.call_soon(after.run)

    task = loop.create_task(run())
    _unfinished.add(task)
    task.add_done_callback(_unfinished.discard)
    return answer
