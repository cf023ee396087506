"""CallGate: the claims of one call pass together, and never wait for a claim that cannot come."""

import asyncio
import time

import pytest

from dra_driver.claims.call_gate import CallGate


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_claims_wait_until_every_other_claim_arrived_or_left() -> None:
    gate = CallGate(3, longest_wait=60)
    first, second, third = gate.ticket(), gate.ticket(), gate.ticket()
    waiting = [asyncio.create_task(first.arrive()), asyncio.create_task(second.arrive())]
    await turns()
    assert not any(task.done() for task in waiting)
    third.leave()  # finished without a record
    await turns()
    assert all(task.done() for task in waiting)


async def test_each_claim_counts_once() -> None:
    gate = CallGate(2, longest_wait=60)
    first, second = gate.ticket(), gate.ticket()
    waiting = asyncio.create_task(first.arrive())
    await turns()
    first.leave()  # the claim's own ending, after it arrived: counted already
    await turns()
    assert not waiting.done()
    second.leave()
    await turns()
    assert waiting.done()


async def test_a_claim_that_comes_after_the_others_passes_at_once() -> None:
    gate = CallGate(2, longest_wait=60)
    first, second = gate.ticket(), gate.ticket()
    first.leave()
    await asyncio.wait_for(second.arrive(), timeout=1)


async def test_the_gate_opens_after_its_longest_wait_when_a_claim_never_comes() -> None:
    async def scenario() -> float:
        gate = CallGate(2, longest_wait=0.05)
        gate.ticket()  # a claim stuck behind a lock the waiting one holds: it never comes
        started = time.monotonic()
        await asyncio.wait_for(gate.ticket().arrive(), timeout=5)
        return time.monotonic() - started

    assert await scenario() >= 0.04


async def test_a_claim_cancelled_while_it_waits_leaves_the_others_waiting() -> None:
    gate = CallGate(3, longest_wait=60)
    first, second, third = gate.ticket(), gate.ticket(), gate.ticket()
    cancelled = asyncio.create_task(first.arrive())
    waiting = asyncio.create_task(second.arrive())
    await turns()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await turns()
    assert not waiting.done()
    third.leave()
    await asyncio.wait_for(waiting, timeout=1)
