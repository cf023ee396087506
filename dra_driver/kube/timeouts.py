"""How long each kind of API call may take: one place, one reason per value."""

import msgspec


class Timeouts(msgspec.Struct, frozen=True):
    """Seconds (the watch's `watch` in whole seconds, as the server takes it)."""

    # A write or a list (slices, pods, the Node, claims for `plan`) that takes longer is treated
    # as failed, and, for a write, as maybe applied.
    request: float = 30.0
    # The claim GET of a prepare: kubelet gives a whole NodePrepareResources call 45 s, and one
    # GET must not eat all of it.
    claim_get: float = 10.0
    # The status writer's GET and PUT: it retries with backoff anyway, and a short timeout frees
    # its turn (it has few) for another claim's write.
    claim_status: float = 10.0
    # The server ends each watch after this long (its `timeoutSeconds`)...
    watch: int = 300
    # ... and the client gives it this margin before it gives up waiting for the end.
    watch_read_margin: float = 30.0


TIMEOUTS = Timeouts()
