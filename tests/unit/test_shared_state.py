"""Two agent processes on one state directory (the old and the new pod of a rolling update).

Two engines in one process stand for them: every lock here belongs to its own open file
(flock(2), or an open-file-description byte lock for claims), which excludes two descriptors of
one process exactly as it excludes two processes. Two tests use a real second process to show
that.
"""

import asyncio
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from dra_driver.claims.engine import ClaimEngine
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import ClaimRecord, ClaimRecordStore
from dra_driver.shared_locks import ClaimLocks, SharedStateLock, try_exclusive
from tests.unit.test_engine_devices import DYNAMIC, Claims, instances, node

UID = "6a0c9c2e-1b7f-4d3a-9e58-2f4b7c1d0e93"


def test_a_turn_is_stale_exactly_when_a_peer_changed_something(tmp_path: Path) -> None:
    async def scenario() -> None:
        mine, peer = SharedStateLock(tmp_path / "state.lock"), SharedStateLock(tmp_path / "state.lock")
        async with mine.hold() as turn:
            assert turn.stale  # never looked yet
        async with mine.hold() as turn:
            assert not turn.stale
            turn.changed()
        async with mine.hold() as turn:
            assert not turn.stale, "its own change does not make its view stale"
        async with peer.hold() as turn:
            assert turn.stale
            turn.changed()
        async with mine.hold() as turn:
            assert turn.stale
        async with mine.hold() as turn:
            assert not turn.stale
        with pytest.raises(RuntimeError):
            async with mine.hold():
                raise RuntimeError("refresh failed half-way")
        async with mine.hold() as turn:
            assert turn.stale, "after a failed turn the view is refreshed again"

    asyncio.run(scenario())


def test_a_turn_waits_for_a_peer_holding_the_lock(tmp_path: Path) -> None:
    async def scenario() -> None:
        mine, peer = SharedStateLock(tmp_path / "state.lock"), SharedStateLock(tmp_path / "state.lock")
        order = []

        async def mine_turn() -> None:
            async with mine.hold():
                order.append("mine")

        async with peer.hold():
            waiting = asyncio.create_task(mine_turn())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            order.append("peer")
        await waiting
        assert order == ["peer", "mine"]

    asyncio.run(scenario())


def test_claim_locks_exclude_peers_one_at_a_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "claim.locks"
        mine, peer, third = ClaimLocks(path), ClaimLocks(path), ClaimLocks(path)
        order = []

        async def take(locks: ClaimLocks, who: str, hold_for: float) -> None:
            async with locks.hold(UID):
                order.append(f"{who} in")
                await asyncio.sleep(hold_for)
                order.append(f"{who} out")

        first = asyncio.create_task(take(peer, "peer", 0.05))
        await asyncio.sleep(0.01)
        # Two waiters in two more "processes" (descriptors): each gets its turn whole.
        await asyncio.gather(
            first, take(mine, "mine", 0.01), take(third, "third", 0.01), take(mine, "mine", 0.01)
        )
        assert order[:2] == ["peer in", "peer out"]
        for start in (2, 4, 6):
            assert order[start].split()[0] == order[start + 1].split()[0], order
            assert (order[start].split()[1], order[start + 1].split()[1]) == ("in", "out"), order
        assert len(mine) == 0
        for locks in (mine, peer, third):
            locks.close()

    asyncio.run(scenario())


def test_claim_locks_for_different_claims_do_not_wait_on_each_other(tmp_path: Path) -> None:
    async def scenario() -> None:
        mine, peer = ClaimLocks(tmp_path / "claim.locks"), ClaimLocks(tmp_path / "claim.locks")
        other = "0f1e2d3c-4b5a-4968-8776-655443322110"
        async with peer.hold(UID):
            await asyncio.wait_for(_enter(mine, other), timeout=1)

    asyncio.run(scenario())


async def _enter(locks: ClaimLocks, uid: str) -> None:
    async with locks.hold(uid):
        pass


def _hold_in_child(path: str, held: Event) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    assert try_exclusive(fd)
    held.set()
    time.sleep(60)  # until killed


@contextmanager
def _child_holding(hold: Callable[[str, Event], None], path: Path) -> Iterator[BaseProcess]:
    """Another process that runs `hold` on `path` until killed; yields it once it holds."""
    context = multiprocessing.get_context("spawn")
    held = context.Event()
    child = context.Process(target=hold, args=(str(path), held))
    child.start()
    try:
        assert held.wait(30)
        yield child
    finally:
        child.kill()
        child.join(10)


def test_a_lock_held_by_another_process_is_not_taken_and_dies_with_it(tmp_path: Path) -> None:
    path = tmp_path / "publisher.lock"
    with _child_holding(_hold_in_child, path) as child:
        fd = os.open(path, os.O_RDWR)
        try:
            assert not try_exclusive(fd)
            child.kill()  # a crashed peer: no unlock, the kernel drops its lock
            child.join(10)
            assert try_exclusive(fd)
        finally:
            os.close(fd)


def _hold_claim_in_child(path: str, held: Event) -> None:
    async def hold() -> None:
        async with ClaimLocks(Path(path)).hold(UID):
            held.set()
            await asyncio.sleep(60)  # until killed

    asyncio.run(hold())


def test_a_claim_lock_held_by_another_process_excludes_us_until_it_dies(tmp_path: Path) -> None:
    path = tmp_path / "claim.locks"
    with _child_holding(_hold_claim_in_child, path) as child:

        async def scenario() -> None:
            locks = ClaimLocks(path)
            waiting = asyncio.create_task(_enter(locks, UID))
            await asyncio.sleep(0.1)
            assert not waiting.done(), "the live process's lock excludes us"
            await asyncio.wait_for(_enter(locks, "0f1e2d3c-4b5a-4968-8776-655443322110"), timeout=1)
            child.kill()  # a crashed peer: no unlock, the kernel drops its lock
            await asyncio.wait_for(waiting, timeout=5)
            locks.close()

        asyncio.run(scenario())


def _two_engines(tmp_path: Path, claims: Claims) -> tuple[ClaimEngine, ClaimEngine]:
    old, _ = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    new, _ = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    return old, new


def test_prepared_by_one_agent_unprepared_by_the_other_and_free_for_both(
    tmp_path: Path,
) -> None:
    claims = Claims()
    first = claims.add("first", {"device": "gpu-2-mig-7g80gb-0"})
    second = claims.add("second", {"device": "gpu-2-mig-7g80gb-0"})

    async def scenario() -> None:
        old, new = _two_engines(tmp_path, claims)
        await old.load_state()
        await new.load_state()
        assert (await new.prepare([first]))[first[2]].error == ""
        refused = (await old.prepare([second]))[second[2]].error
        assert "device gpu-2-mig-7g80gb-0 is already prepared for claim default/first" in refused
        assert await old.unprepare([first]) == {first[2]: ""}
        assert not (tmp_path / "state" / "claims" / f"{first[2]}.json").exists()
        assert list((tmp_path / "cdi").iterdir()) == []
        assert (await new.prepare([second]))[second[2]].error == "", "new saw the old one free gpu-2"
        assert (await old.prepare([first]))[first[2]].error.startswith("claim default/first"), (
            "and old sees it taken"
        )
        assert set(old.prepared_claims) == set(new.prepared_claims) == {second[2]}

    asyncio.run(scenario())


def test_a_retry_reaching_the_other_agent_gets_the_same_answer_and_no_second_instance(tmp_path: Path) -> None:
    claims = Claims()
    mig = claims.add("mig", {"device": "gpu-1-mig-1g10gb-3"})

    async def scenario() -> None:
        old, new = _two_engines(tmp_path, claims)
        hardware = old._hardware
        assert hardware is not None
        await old.load_state()
        await new.load_state()
        together = await asyncio.gather(old.prepare([mig]), new.prepare([mig]))
        answers = [outcome[mig[2]] for outcome in together]
        assert answers[0] == answers[1] and answers[0].error == ""
        assert len(await instances(old._hardware)) == 1  # type: ignore[arg-type]
        assert await new.unprepare([mig]) == {mig[2]: ""}
        assert await instances(old._hardware) == []  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_a_starting_agent_waits_for_a_peers_prepare_instead_of_rolling_it_back(tmp_path: Path) -> None:
    claims = Claims()
    store = ClaimRecordStore(tmp_path / "state")
    store.load_all()
    ref = claim_ref("default", "busy", UID)
    peer_locks = ClaimLocks(tmp_path / "state" / "claim.locks")

    async def scenario() -> None:
        _, new = _two_engines(tmp_path, claims)
        async with peer_locks.hold(UID):
            store.reserve(ClaimRecord(claim=ref, devices=(), state="preparing", reserved=("gpu-0",)))
            starting = asyncio.create_task(new.load_state())
            await asyncio.sleep(0.1)
            assert not starting.done(), "the start waits for the peer's claim"
            store.save(ClaimRecord(claim=ref, devices=(), state="prepared"))
        await starting
        assert store.read(UID) == ClaimRecord(claim=ref, devices=(), state="prepared")
        assert set(new.prepared_claims) == {UID}

    asyncio.run(scenario())


def test_a_peers_unfinished_reservation_is_rolled_back_by_whoever_gets_the_claim_next(tmp_path: Path) -> None:
    claims = Claims()
    claim = claims.add("again", {"device": "gpu-4-mig-7g80gb-0"})
    store = ClaimRecordStore(tmp_path / "state")
    store.load_all()

    async def scenario() -> None:
        _, new = _two_engines(tmp_path, claims)
        await new.load_state()
        # A peer died right after taking gpu-4 (its lock died with it; its record stays).
        dead = ClaimRecord(
            claim=claim_ref(*claim), devices=(), state="preparing", reserved=("gpu-4-mig-7g80gb-0",)
        )
        store.reserve(dead)
        outcome = (await new.prepare([claim]))[claim[2]]
        assert outcome.error == "" and [d.device for d in outcome.devices] == ["gpu-4-mig-7g80gb-0"]
        record = json.loads((tmp_path / "state" / "claims" / f"{claim[2]}.json").read_text())
        assert record["state"] == "prepared"

    asyncio.run(scenario())
