"""The GPU check's step orchestration, with GPU-less steps: a failing step is a failed check and
the run goes on, a step past its time is interrupted, and what is left running is closed."""

import time
from pathlib import Path

from tests.support.gpu_check.report import Check
from tests.support.gpu_check.runner import run_steps
from tests.support.gpu_check.steps import Context, Options, Step


class Closing(Context):
    closed = 0

    def close(self) -> None:
        self.closed += 1


def context(tmp_path: Path) -> Closing:
    return Closing(Options(out=tmp_path, scratch=tmp_path))


def test_a_step_that_raises_fails_and_the_next_still_runs(tmp_path: Path) -> None:
    def broken(ctx: Context, timeout: float) -> list[Check]:
        raise RuntimeError("no agent")

    ctx = context(tmp_path)
    steps = [Step("broken", 5, broken), Step("fine", 5, lambda ctx, timeout: [Check("fine", "pass")])]

    records = run_steps(steps, ctx, total_s=60)

    assert [(r.step, [(c.status, c.detail) for c in r.checks]) for r in records] == [
        ("broken", [("fail", "RuntimeError: no agent")]),
        ("fine", [("pass", "")]),
    ]
    assert ctx.closed == 1


def test_each_step_gets_the_smaller_of_its_timeout_and_what_is_left(tmp_path: Path) -> None:
    given: list[float] = []

    def record(ctx: Context, timeout: float) -> list[Check]:
        given.append(timeout)
        return []

    now = [0.0]
    steps = [Step("a", 30, record), Step("b", 100, record), Step("c", 100, record)]

    def clock() -> float:
        now[0] += 20.0  # each reading of the clock is 20 s later
        return now[0]

    records = run_steps(steps, context(tmp_path), total_s=90, clock=clock)

    assert given == [30, 30]  # b starts at 80 s of a 110 s deadline
    assert records[2].checks[0].status == "skip"
    assert "out of time" in records[2].checks[0].detail


def test_a_step_past_its_time_is_interrupted(tmp_path: Path) -> None:
    def hangs(ctx: Context, timeout: float) -> list[Check]:
        time.sleep(60)
        return [Check("never", "pass")]

    started = time.monotonic()
    records = run_steps([Step("hangs", 4, hangs)], context(tmp_path), total_s=60)

    assert time.monotonic() - started < 15
    assert records[0].checks[0].status == "fail"
    assert "interrupted after" in records[0].checks[0].detail
