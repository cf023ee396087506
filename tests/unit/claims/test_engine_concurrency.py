"""The engine under overlapping calls, in one event loop, with a claim source that answers slowly
and in random order, so every interleaving of GET, ownership check and durable write is tried."""

import asyncio
import contextvars
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.claims.calls import AfterAnswer, RawClaim, to_the_end
from tests.support.engines import simulated_engine

DRIVER = "gpu.dra-driver.dev"


class SlowClaims:
    def __init__(self, seed: int) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._random = random.Random(seed)

    def add(self, name: str, device: str) -> RawClaim:
        uid = str(uuid.UUID(int=self._random.getrandbits(128), version=4))
        self.claims[("default", name)] = {
            "metadata": {"namespace": "default", "name": name, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device}]
                    }
                }
            },
        }
        return RawClaim("default", name, uid)

    async def get(self, namespace: str, name: str) -> object:
        await asyncio.sleep(self._random.random() / 500)
        return self.claims[(namespace, name)]


# Flushed records are written in a thread, so the loop turns at every write; unflushed ones (the
# agent's default) are written on the loop: both orders of events are tried.
FLUSH = pytest.mark.parametrize("flush", [True, False], ids=["flushed", "unflushed"])


@FLUSH
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    wanted=st.lists(st.sampled_from(["gpu-0", "gpu-1", "gpu-2"]), min_size=2, max_size=24),
)
async def test_overlapping_calls_never_give_one_gpu_to_two_claims(
    tmp_path_factory: Any, flush: bool, seed: int, wanted: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("engine")
    source = SlowClaims(seed)
    claims = [source.add(f"c{i}", device) for i, device in enumerate(wanted)]

    engine = simulated_engine(tmp, source, flush=flush)
    await engine.load_state()
    # One call per claim, all at once, plus every claim repeated (kubelet retries).
    answers = await asyncio.gather(*(engine.prepare([claim]) for claim in claims + claims))
    merged: dict[str, Any] = {}
    for answer in answers:
        merged.update(answer)
    outcomes, prepared = merged, engine.prepared_claims

    winners = {uid: outcome.devices[0].device for uid, outcome in outcomes.items() if not outcome.error}
    assert sorted(winners.values()) == sorted(set(wanted))  # each wanted GPU went to exactly one claim
    assert set(prepared) == set(winners)
    losers = [outcome.error for outcome in outcomes.values() if outcome.error]
    assert all("is already prepared for claim" in error for error in losers)
    # Durable state agrees: one record and one spec per winner, nothing for the losers.
    assert sorted(p.stem for p in (tmp / "state" / "claims").iterdir()) == sorted(winners)
    assert len(list((tmp / "cdi").iterdir())) == len(winners)


@FLUSH
async def test_overlapping_prepare_and_unprepare_of_one_claim_stay_consistent(
    tmp_path: Path, flush: bool
) -> None:
    source = SlowClaims(7)
    claim = source.add("shared", "gpu-3")

    engine = simulated_engine(tmp_path, source, flush=flush)
    await engine.load_state()
    calls = [engine.prepare([claim]) if i % 3 else engine.unprepare([claim]) for i in range(30)]
    await asyncio.gather(*calls)
    await engine.unprepare([claim])
    assert engine.prepared_claims == {}
    assert list((tmp_path / "state" / "claims").iterdir()) == []
    assert list((tmp_path / "cdi").iterdir()) == []


async def test_a_claim_listed_twice_in_one_call_does_not_wait_for_itself(tmp_path: Path) -> None:
    """The second copy waits for the claim's lock, which the first holds until its claim is
    prepared; then it finds the claim prepared, and the call is answered once for it."""
    source = SlowClaims(3)
    claim = source.add("c0", "gpu-0")

    engine = simulated_engine(tmp_path, source)
    await engine.load_state()
    answer = await asyncio.wait_for(engine.prepare([claim, claim]), timeout=5)
    assert [(outcome.error, len(outcome.devices)) for outcome in answer.values()] == [("", 1)]


async def other_tasks_finished() -> None:
    """Waits for every task but the caller's: the claim work that goes on after its call ended."""
    await asyncio.gather(
        *(task for task in asyncio.all_tasks() if task is not asyncio.current_task()), return_exceptions=True
    )


@pytest.mark.parametrize("claims_in_call", [1, 3])
async def test_a_call_kubelet_gives_up_on_still_finishes_its_claims(
    tmp_path: Path, claims_in_call: int
) -> None:
    """kubelet cancels a call at its deadline or when the connection drops; the claims' work must
    run to the end anyway, so memory and disk agree and the retry finds them prepared."""
    source = SlowClaims(7)
    claims = [source.add(f"c{i}", f"gpu-{i}") for i in range(claims_in_call)]

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        engine = simulated_engine(tmp_path, source)
        await engine.load_state()
        call = asyncio.create_task(engine.prepare(claims))
        await asyncio.sleep(0)  # the call has started: its GETs are under way
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The claim work goes on as tasks of its own: wait for them, then look, then retry.
        await other_tasks_finished()
        prepared = dict(engine.prepared_claims)
        return await engine.prepare(claims), prepared

    retried, prepared = await scenario()
    assert set(prepared) == {uid for _, _, uid in claims}
    assert all(not outcome.error and outcome.devices for outcome in retried.values())
    assert sorted(file.name for file in (tmp_path / "state" / "claims").iterdir()) == sorted(
        f"{uid}.json" for _, _, uid in claims
    )


@pytest.mark.parametrize("claims_in_call", [1, 3])
async def test_an_unprepare_kubelet_gives_up_on_still_finishes(tmp_path: Path, claims_in_call: int) -> None:
    source = SlowClaims(11)
    claims = [source.add(f"c{i}", f"gpu-{i}") for i in range(claims_in_call)]

    engine = simulated_engine(tmp_path, source)
    await engine.load_state()
    await engine.prepare(claims)
    call = asyncio.create_task(engine.unprepare(claims))
    await asyncio.sleep(0)  # the call has started: the claims' locks are being taken
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await other_tasks_finished()
    assert dict(engine.prepared_claims) == {}
    assert list((tmp_path / "state" / "claims").iterdir()) == []
    assert list((tmp_path / "cdi").iterdir()) == []


async def test_work_run_to_the_end_passes_its_failure_to_a_caller_still_waiting() -> None:
    async def failing() -> int:
        await asyncio.sleep(0)
        raise ValueError("a bug in the claim work")

    with pytest.raises(ValueError, match="a bug in the claim work"):
        await to_the_end(failing())


async def test_work_left_for_after_the_answer_runs_once_the_waiter_has_resumed_in_its_own_context() -> None:
    events: list[str] = []
    claim = contextvars.ContextVar("claim", default="none")

    async def work(after: AfterAnswer) -> int:
        await asyncio.sleep(0)
        claim.set("a")
        after.leave(lambda: events.append(f"left by {claim.get()}"))
        claim.set("b")
        return 7

    async def scenario() -> None:
        after = AfterAnswer()
        events.append(f"answered {await to_the_end(work(after), after)}")
        await asyncio.sleep(0)
        events.append("next turn")

    await scenario()
    assert events == ["answered 7", "left by a", "next turn"]


async def test_a_failing_piece_left_for_after_the_answer_is_logged_and_costs_the_others_nothing() -> None:
    events: list[str] = []

    def failing() -> None:
        raise RuntimeError("a bug in a log line")

    async def work(after: AfterAnswer) -> None:
        after.leave(failing)
        after.leave(lambda: events.append("second piece"))

    async def scenario() -> None:
        after = AfterAnswer()
        await to_the_end(work(after), after)
        await asyncio.sleep(0)

    with structlog.testing.capture_logs() as logged:
        await scenario()
    assert events == ["second piece"]
    assert [(line["event"], line["log_level"]) for line in logged] == [
        ("work left for after an answer failed", "error")
    ]
    assert "a bug in a log line" in logged[0]["error"]


async def test_work_run_to_the_end_logs_a_failure_nobody_waits_for() -> None:
    finished = []

    async def failing() -> None:
        await asyncio.sleep(0.01)
        finished.append(True)
        raise ValueError("a bug in the claim work")

    with structlog.testing.capture_logs() as logged:
        caller = asyncio.create_task(asyncio.wait_for(to_the_end(failing()), 0.001))
        with pytest.raises(TimeoutError):
            await caller
        await other_tasks_finished()
    assert finished == [True]
    assert [(line["event"], line["log_level"]) for line in logged] == [
        ("claim work failed after its caller stopped waiting", "error")
    ]
    assert "a bug in the claim work" in logged[0]["error"]
