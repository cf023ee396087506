"""The records of one kubelet call's claims go to the group commit together (flushed records only:
`--flush-records`).

Kubelet hears about a call only when every claim in it is prepared, so one claim's record made
durable before the call's other claims are ready gains nothing. It does cost something: the group
commit flushes that record alone, and the claims that get there meanwhile (their GETs answered one
after another) wait for that flush to end before they take a second one. So in a call of several
claims each claim waits here with its finished record until every other claim of the call has
come too or has finished without one. Then all of them submit in the same loop turn and share one
flush.

A claim waits here holding its claim lock. If another claim of the call waits for that lock (the
same claim listed twice, say), that claim never comes. So the gate also opens `longest_wait` seconds
after it was set up, whatever is still missing. At worst a record is flushed that much later, where
the call's answer would have waited anyway.
"""

import asyncio

# Long enough for a call's GETs to be answered one after another by a busy API server; only a
# claim that cannot come at all (see above) makes the others wait this long.
LONGEST_WAIT_SECONDS = 0.05


class CallGate:
    """The gate of one call with `claims` claims; each claim takes one `ticket()`."""

    def __init__(self, claims: int, longest_wait: float = LONGEST_WAIT_SECONDS) -> None:
        loop = asyncio.get_running_loop()
        self._missing = claims
        # One future per waiting claim: a claim cancelled while it waits cancels only its own.
        self._waiting: list[asyncio.Future[None]] = []
        self._open = False
        self._timer = loop.call_later(longest_wait, self._let_through)

    def ticket(self) -> "GateTicket":
        return GateTicket(self)

    def _one_less(self) -> None:
        self._missing -= 1
        if self._missing <= 0:
            self._let_through()

    async def _wait(self) -> None:
        if self._open:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        await waiter

    def _let_through(self) -> None:
        if self._open:
            return
        self._open = True
        self._timer.cancel()
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)
        self._waiting = []


class GateTicket:
    """One claim's passage: `arrive` with its record ready, or `leave` without one; whichever
    comes first counts, the other then does nothing."""

    __slots__ = ("_counted", "_gate")

    def __init__(self, gate: CallGate) -> None:
        self._gate = gate
        self._counted = False

    async def arrive(self) -> None:
        """Waits until the call's other claims have arrived or left (or the gate's time is up)."""
        self._count()
        await self._gate._wait()

    def leave(self) -> None:
        self._count()

    def _count(self) -> None:
        if not self._counted:
            self._counted = True
            self._gate._one_less()
