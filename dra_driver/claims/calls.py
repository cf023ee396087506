"""How one kubelet call's claims are run: concurrently, each to its end, each answered on its own.

The claims of a call run under asyncio.gather, shielded by asyncio.shield from kubelet giving up:
hand-made forms of both that saved a future and a loop turn were measured on the real cluster and
saved nothing a pod start shows (docs/benchmarks.md, "Pod start on the real cluster").
"""

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, TypeVar

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


_unfinished: set["asyncio.Future[Any]"] = set()  # asyncio keeps only weak references to tasks


def to_the_end(work: Awaitable[_T], after: AfterAnswer | None = None) -> "asyncio.Future[_T]":
    """Runs `work` to its end even if whoever awaits the answer stops waiting (kubelet's deadline,
    a dropped connection), so memory and disk agree and kubelet's retry finds the claims done: the
    work is shielded from its caller's cancellation. `after`: run once the answer is set and its
    waiter has had the loop turn in which it hands gRPC the answer."""
    task = asyncio.ensure_future(work)
    _unfinished.add(task)
    task.add_done_callback(_unfinished.discard)
    answer = asyncio.shield(task)
    # After shield's own callback, which passes the outcome on to `answer` and so wakes the waiter.
    task.add_done_callback(functools.partial(_settled, answer, after))
    return answer


def _settled(answer: "asyncio.Future[Any]", after: AfterAnswer | None, task: "asyncio.Future[Any]") -> None:
    if not task.cancelled() and (error := task.exception()) is not None and answer.cancelled():
        log.error("claim work failed after its caller stopped waiting", error=repr(error))
    if after:
        # Queued behind the waiter's wake-up: the waiter hands gRPC the answer first.
        asyncio.get_running_loop().call_soon(after.run)
