"""The one error of every API call, and the one place that says what a failure means.

Every call (`kube.calls`) turns what went wrong into an `ApiError`: a transport failure (no
connection, a reset, a timeout, an answer that is not HTTP) as status 0, "no answer"; an answer
with an unexpected status with the reason and message of the Status object the server sent. The
callers branch on the predicates below and never on transport exceptions or status numbers, and
they word their own messages from the fields (the claim source, for one, says "not found (deleted,
or never created)").
"""

import asyncio
import json
from collections.abc import Mapping

from dra_driver.base.errors import TransientFault

# What a call raises when no (readable) answer came (kube_http). OSError: a connection refused or
# reset, TLS trouble (ssl.SSLError), a proxy that refused the tunnel; ValueError: HttpProtocolError
# (an answer that is not HTTP/1.x), and a header value that cannot be sent; IncompleteReadError: a
# body cut short, in the middle of a watch's line too.
TRANSPORT_ERRORS = (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError)

# Answers after which retrying the same request cannot help: it is malformed, RBAC refuses the
# agent, the server refuses the content. 401 is not among them: a projected token that expired is
# read afresh by the next request.
FINAL_STATUSES = frozenset({400, 403, 405, 415, 422})


class ApiError(TransientFault):
    """A failed call. `status` 0: no answer came; `reason`: the Status's reason ("Conflict"), ""
    when the server sent none; `message`: why, as one phrase. A TransientFault, since most calls
    that fail are worth another (no answer, a conflict, 410, 5xx); `final` names the answers after
    which the same request cannot succeed."""

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

    @property
    def final(self) -> bool:
        """Retrying the same request cannot help (see FINAL_STATUSES)."""
        return self.status in FINAL_STATUSES


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
