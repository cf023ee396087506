"""The one error of every API call, and the one place that says what a failure means.

Every call (`kube.calls`) turns what went wrong into an `ApiError`: a transport failure (no
connection, a reset, a timeout, an answer that is not HTTP) as status 0, "no answer"; an answer
with an unexpected status with the reason and message of the Status object the server sent. The
callers branch on the predicates below and never on transport exceptions or status numbers, and
they word their own messages from the fields (the claim source, for one, says "not found (deleted,
or never created)").

Whether another try can help is the one thing the status decides here and nowhere else: each
ApiError is made as one of two members of the family, by `FINAL_STATUSES`. A `TransientApiError`
(no answer, 401, a conflict, 410, 429, 5xx) is a TransientFault, so the loops that retry by
branch retry it; a `FinalApiError` (the request is malformed, RBAC refuses it, the object or the
resource is not there) is an OperatorFault, which the same request cannot get past. `except
ApiError` still catches both.
"""

import asyncio
import json
from collections.abc import Mapping

from dra_driver.base.errors import DriverError, OperatorFault, TransientFault

# What a call raises when no (readable) answer came (kube_http). OSError: a connection refused or
# reset, TLS trouble (ssl.SSLError), a proxy that refused the tunnel; ValueError: HttpProtocolError
# (an answer that is not HTTP/1.x), and a header value that cannot be sent; IncompleteReadError: a
# body cut short, in the middle of a watch's line too.
TRANSPORT_ERRORS = (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError)

# Answers after which retrying the same request cannot help: it is malformed, RBAC refuses the
# agent, the object or the resource is not there, the server refuses the content. 401 is not among
# them: a projected token that expired is read afresh by the next request.
FINAL_STATUSES = frozenset({400, 403, 404, 405, 415, 422})


class ApiError(DriverError):
    """A failed call. `status` 0: no answer came; `reason`: the Status's reason ("Conflict"), ""
    when the server sent none; `message`: why, as one phrase.

    The family of the two below, never an instance of its own: `ApiError(...)` makes the member
    that `status` calls for, so a branch is chosen once, here, however the error is made."""

    def __new__(cls, call: str, status: int, reason: str, message: str) -> "ApiError":
        member = cls
        if cls is ApiError:
            member = FinalApiError if status in FINAL_STATUSES else TransientApiError
        return super().__new__(member, call, status, reason, message)

    def __init__(self, call: str, status: int, reason: str, message: str) -> None:
        answer = " ".join(part for part in (f"API server answered {status}", reason) if part)
        super().__init__(f"{call}: {answer if status else 'no answer'}: {message}")
        self.call, self.status, self.reason, self.message = call, status, reason, message

    @classmethod
    def from_transport(cls, call: str, error: BaseException) -> "ApiError":
        return cls(call, 0, "", str(error) or type(error).__name__)

    @classmethod
    def from_answer(cls, call: str, status: int, body: bytes) -> "ApiError":
        return cls(call, status, *status_reason_and_message(body))

    @property
    def no_answer(self) -> bool:
        """Nothing (readable) came back: a write may or may not have been applied."""
        return self.status == 0

    @property
    def expired(self) -> bool:
        """410 Gone: the resourceVersion is too old to watch from; list again."""
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409: the object changed since it was read (or exists already); read it again."""
        return self.status == 409


class TransientApiError(ApiError, TransientFault):
    """No answer, or an answer that the next try may not get (a conflict, 410, 429, 5xx)."""


class FinalApiError(ApiError, OperatorFault):
    """An answer the same request gets again (FINAL_STATUSES): what fixes it is the operator's
    (RBAC, the server's version) or the caller's (the object is gone)."""


def status_reason_and_message(body: bytes) -> tuple[str, str]:
    """The Status's `reason` and `message`; for a body that is no Status (a proxy's error page,
    truncated JSON) no reason and the start of whatever came back, so an error still says
    something."""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if not isinstance(decoded, Mapping):
        return "", body[:200].decode(errors="replace")
    reason, message = decoded.get("reason"), decoded.get("message")
    return (
        reason if isinstance(reason, str) else "",
        message if isinstance(message, str) else body[:200].decode(errors="replace"),
    )


# What a loop that keeps a view of the server, or the server's slices, right for the agent's
# lifetime (`kube.watching`, the slice controller) tries again at its backoff: every
# TransientFault, and the server's final answers as well. A final answer's remedy (RBAC, the
# server's version) is changed outside the agent and shows at the next try without a restart,
# while a loop that ended would leave the node unwatched or unpublished in silence. Anything
# else (a ClaimFault, an OperatorFault of the agent's own input, a bug) ends the loop.
KEPT_TRYING: tuple[type[DriverError], ...] = (TransientFault, FinalApiError)
