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
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord, PreparedDevice
from dra_driver.claims.reservations import Reservation, decode_table
from dra_driver.devices.node_config import NodeConfig
from dra_driver.state.shared_locks import (
    ClaimLocks,
    InvalidSharedTable,
    SharedStateLock,
    _offset_of,
    _try_lock_byte,
    _unlock_byte,
    try_exclusive,
)
from tests.support.memory_claims import MemoryClaims
from tests.unit.claims.test_engine_devices import DYNAMIC, instances, node

UID = "6a0c9c2e-1b7f-4d3a-9e58-2f4b7c1d0e93"


async def test_a_turn_is_stale_exactly_when_a_peer_changed_something(tmp_path: Path) -> None:
    mine, peer = SharedStateLock(tmp_path / "state.lock"), SharedStateLock(tmp_path / "state.lock")
    async with mine.hold() as turn:
        assert turn.stale  # never looked yet
        assert turn.table() == b"", "a new lock file has an empty table"
    async with mine.hold() as turn:
        assert not turn.stale
        turn.changed(b"first")
    async with mine.hold() as turn:
        assert not turn.stale, "its own change does not make its view stale"
    async with peer.hold() as turn:
        assert turn.stale and turn.table() == b"first"
        turn.changed(b"second")
    async with mine.hold() as turn:
        assert turn.stale and turn.table() == b"second"
    async with mine.hold() as turn:
        assert not turn.stale
    with pytest.raises(RuntimeError):
        async with mine.hold():
            raise RuntimeError("refresh failed half-way")
    async with mine.hold() as turn:
        assert turn.stale, "after a failed turn the view is refreshed again"


async def test_a_table_write_cut_short_leaves_the_last_whole_table(tmp_path: Path) -> None:
    """A change writes the slot the next counter picks, then the counter: a process killed between
    the two (or half-way through the slot) leaves the previous table readable."""

    path = tmp_path / "state.lock"
    async with SharedStateLock(path).hold() as turn:
        turn.changed(b"whole")
    with path.open("r+b") as file:  # the next change's slot, half-written, the counter not yet
        file.seek(4096)
        file.write(b"\x40\x00\x00\x00garbage")
    async with SharedStateLock(path).hold() as turn:
        assert turn.table() == b"whole"
        turn.changed(b"next")
    async with SharedStateLock(path).hold() as turn:
        assert turn.table() == b"next"


async def test_a_damaged_table_is_refused_naming_the_slot(tmp_path: Path) -> None:
    path = tmp_path / "state.lock"
    async with SharedStateLock(path).hold() as turn:
        turn.changed(b"{}")
    with path.open("r+b") as file:
        file.seek(4096 + 4 * 1024 * 1024 + 8)
        file.write(b"[]")  # same length, wrong checksum
    async with SharedStateLock(path).hold() as turn:
        with pytest.raises(InvalidSharedTable, match=r"state.lock: table slot at byte 4198400: the payload"):
            turn.table()
    with pytest.raises(ValueError, match="at most"):
        async with SharedStateLock(path).hold() as turn:
            turn.changed(bytes(4 * 1024 * 1024))


async def test_a_turn_waits_for_a_peer_holding_the_lock(tmp_path: Path) -> None:
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


async def test_claim_locks_exclude_peers_one_at_a_time(tmp_path: Path) -> None:
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


async def test_claim_locks_for_different_claims_do_not_wait_on_each_other(tmp_path: Path) -> None:
    mine, peer = ClaimLocks(tmp_path / "claim.locks"), ClaimLocks(tmp_path / "claim.locks")
    other = "0f1e2d3c-4b5a-4968-8776-655443322110"
    async with peer.hold(UID):
        await asyncio.wait_for(_enter(mine, other), timeout=1)


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


async def test_a_claim_lock_held_by_another_process_excludes_us_until_it_dies(tmp_path: Path) -> None:
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

        await scenario()


def _two_engines(tmp_path: Path, claims: MemoryClaims) -> tuple[ClaimEngine, ClaimEngine]:
    old, _ = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    new, _ = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    return old, new


async def test_prepared_by_one_agent_unprepared_by_the_other_and_free_for_both(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    first = claims.add("first", {"device": "gpu-2-mig-7g80gb-0"})
    second = claims.add("second", {"device": "gpu-2-mig-7g80gb-0"})

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


async def test_a_retry_reaching_the_other_agent_gets_the_same_answer_and_no_second_instance(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    mig = claims.add("mig", {"device": "gpu-1-mig-1g10gb-3"})

    old, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    new, _ = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    await old.load_state()
    await new.load_state()
    together = await asyncio.gather(old.prepare([mig]), new.prepare([mig]))
    answers = [outcome[mig[2]] for outcome in together]
    assert answers[0] == answers[1] and answers[0].error == ""
    assert len(await instances(hardware)) == 1
    assert await new.unprepare([mig]) == {mig[2]: ""}
    assert await instances(hardware) == []


async def test_a_starting_agent_waits_for_a_peers_prepare_instead_of_rolling_it_back(tmp_path: Path) -> None:
    claims = MemoryClaims()
    store = ClaimRecordStore(tmp_path / "state")
    store.load_all()
    ref = claim_ref("default", "busy", UID)
    peer_locks = ClaimLocks(tmp_path / "state" / "claim.locks")

    _, new = _two_engines(tmp_path, claims)
    async with peer_locks.hold(UID):
        store.save(ClaimRecord(claim=ref, devices=(), state="preparing", reserved=("gpu-0",)))
        starting = asyncio.create_task(new.load_state())
        await asyncio.sleep(0.1)
        assert not starting.done(), "the start waits for the peer's claim"
        store.save(ClaimRecord(claim=ref, devices=(), state="prepared"))
    await starting
    assert store.read(UID) == ClaimRecord(claim=ref, devices=(), state="prepared")
    assert set(new.prepared_claims) == {UID}


async def test_a_peers_unfinished_preparing_record_is_rolled_back_by_whoever_gets_the_claim_next(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    claim = claims.add("again", {"device": "gpu-4-mig-7g80gb-0"})
    store = ClaimRecordStore(tmp_path / "state")
    store.load_all()

    _, new = _two_engines(tmp_path, claims)
    await new.load_state()
    # A peer died right after recording that it takes gpu-4 (its lock died with it; its
    # record stays).
    dead = ClaimRecord(
        claim=claim_ref(*claim), devices=(), state="preparing", reserved=("gpu-4-mig-7g80gb-0",)
    )
    store.save(dead)
    outcome = (await new.prepare([claim]))[claim[2]]
    assert outcome.error == "" and [d.device for d in outcome.devices] == ["gpu-4-mig-7g80gb-0"]
    record = json.loads((tmp_path / "state" / "claims" / f"{claim[2]}.json").read_text())
    assert record["state"] == "prepared"


def _whole_gpu_engines(tmp_path: Path, claims: MemoryClaims) -> tuple[ClaimEngine, ClaimEngine]:
    old, _ = node(tmp_path, "l4x8", NodeConfig(), claims)
    new, _ = node(tmp_path, "l4x8", NodeConfig(), claims)
    return old, new


async def test_a_peer_sees_a_device_taken_while_its_prepare_is_under_way_and_after(tmp_path: Path) -> None:
    """Between taking the device and its record being on disk, a whole-GPU prepare has nothing on
    disk but its entry in the shared reservation table: the peer must refuse the device anyway."""
    claims = MemoryClaims()
    first = claims.add("first", {"device": "gpu-3"})
    second = claims.add("second", {"device": "gpu-3"})

    old, new = _whole_gpu_engines(tmp_path, claims)
    await old.load_state()
    await new.load_state()
    record_create = old._records.create
    go_on = asyncio.Event()

    async def held_record_create(record: ClaimRecord) -> None:
        await go_on.wait()
        await record_create(record)

    old._records.create = held_record_create  # type: ignore[method-assign]
    preparing = asyncio.create_task(old.prepare([first]))
    await asyncio.sleep(0.05)
    assert not (tmp_path / "state" / "claims" / f"{first[2]}.json").exists()
    refused = (await new.prepare([second]))[second[2]].error
    assert "device gpu-3 is already prepared for claim default/first" in refused
    go_on.set()
    assert (await preparing)[first[2]].error == ""
    refused = (await new.prepare([second]))[second[2]].error
    assert "device gpu-3 is already prepared for claim default/first" in refused, "now by its record"
    assert await new.unprepare([first]) == {first[2]: ""}
    assert (await old.prepare([second]))[second[2]].error == ""


async def _peer_reserves(tmp_path: Path, claim: tuple[str, str, str], device: str) -> None:
    """Writes a peer process's reservation into the shared table, as its node-wide turn would."""
    async with SharedStateLock(tmp_path / "state" / "state.lock").hold() as turn:
        table = decode_table(turn.table())
        table.add(Reservation(claim_ref(*claim), (device,), owner="peer-process"))
        turn.changed(table.encoded())


async def test_a_reservation_stands_while_its_claim_lock_is_held_and_no_longer(tmp_path: Path) -> None:
    claims = MemoryClaims()
    peers = claims.add("peers", {"device": "gpu-5"})
    mine = claims.add("mine", {"device": "gpu-5"})
    peer_locks = ClaimLocks(tmp_path / "state" / "claim.locks")

    _, engine = _whole_gpu_engines(tmp_path, claims)
    await engine.load_state()
    async with peer_locks.hold(peers[2]):
        await _peer_reserves(tmp_path, peers, "gpu-5")
        refused = (await engine.prepare([mine]))[mine[2]].error
        assert "device gpu-5 is already prepared for claim default/peers" in refused
    # The peer's prepare ended without a record (it failed, or the process died): the lock is
    # free, so the entry is a leftover and the device is free.
    assert (await engine.prepare([mine]))[mine[2]].error == ""
    async with SharedStateLock(tmp_path / "state" / "state.lock").hold() as turn:
        assert decode_table(turn.table()).get(peers[2]) is None, "the leftover is gone from the table too"


async def test_a_finished_peer_reservation_gives_way_to_its_record(tmp_path: Path) -> None:
    claims = MemoryClaims()
    peers = claims.add("peers", {"device": "gpu-6"})
    mine = claims.add("mine", {"device": "gpu-6"})
    store = ClaimRecordStore(tmp_path / "state")

    _, engine = _whole_gpu_engines(tmp_path, claims)
    await engine.load_state()
    await _peer_reserves(tmp_path, peers, "gpu-6")
    prepared = PreparedDevice(("gpu",), "node-a", "gpu-6", ("k8s.gpu.dra-driver.dev/claim=x-gpu-6",), "gpu-6")
    store.save(ClaimRecord(claim=claim_ref(*peers), devices=(prepared,)))
    refused = (await engine.prepare([mine]))[mine[2]].error
    assert "device gpu-6 is already prepared for claim default/peers" in refused
    assert set(engine.prepared_claims) == {peers[2]}


async def test_a_peer_prepare_finishing_while_the_view_is_refreshed_is_never_missed(tmp_path: Path) -> None:
    """The peer writes its record and lets go of the claim lock right after this process has read
    the records: its reservation, judged before that read, must still count."""
    claims = MemoryClaims()
    peers = claims.add("peers", {"device": "gpu-7"})
    mine = claims.add("mine", {"device": "gpu-7"})
    store = ClaimRecordStore(tmp_path / "state")

    _, engine = _whole_gpu_engines(tmp_path, claims)
    await engine.load_state()
    fd = os.open(tmp_path / "state" / "claim.locks", os.O_RDWR)
    assert _try_lock_byte(fd, _offset_of(peers[2]))
    await _peer_reserves(tmp_path, peers, "gpu-7")
    read_all = store.read_all

    def records_then_peer_finishes() -> dict[str, ClaimRecord]:
        records = read_all()
        device = PreparedDevice(("gpu",), "node-a", "gpu-7", ("k8s.gpu.dra-driver.dev/claim=x",), "gpu-7")
        store.save(ClaimRecord(claim=claim_ref(*peers), devices=(device,)))
        _unlock_byte(fd, _offset_of(peers[2]))
        return records

    engine._records.read_all = records_then_peer_finishes  # type: ignore[method-assign]
    refused = (await engine.prepare([mine]))[mine[2]].error
    assert "device gpu-7 is already prepared for claim default/peers" in refused
    os.close(fd)


async def test_a_peer_reservation_in_an_unchanged_view_is_looked_at_again_before_refusing(
    tmp_path: Path,
) -> None:
    """The peer's prepare died after this process last read the table, and nobody has changed
    anything since: the turn is not stale, yet the device must not stay refused."""
    claims = MemoryClaims()
    peers = claims.add("peers", {"device": "gpu-1"})
    other = claims.add("other", {"device": "gpu-2"})
    mine = claims.add("mine", {"device": "gpu-1"})
    peer_locks = ClaimLocks(tmp_path / "state" / "claim.locks")

    _, engine = _whole_gpu_engines(tmp_path, claims)
    await engine.load_state()
    async with peer_locks.hold(peers[2]):
        await _peer_reserves(tmp_path, peers, "gpu-1")
        # This process reads the table (the peer's entry is live) and changes nothing after.
        assert (await engine.prepare([other]))[other[2]].error == ""
    assert (await engine.prepare([mine]))[mine[2]].error == ""
