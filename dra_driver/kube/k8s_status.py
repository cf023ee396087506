"""Reading the Status object the API server answers a failed request with."""

import json
from collections.abc import Mapping


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
