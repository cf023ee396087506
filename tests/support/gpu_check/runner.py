"""Runs the steps in order within one overall deadline and records what each found.

Each step gets the smaller of its own timeout and what is left of the run; past it (plus a grace
for the step's own timeouts to fire first) an interval timer interrupts it. A step that raises is
a failed check, and the run goes on: later steps skip what they lack.
"""

import signal
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from tests.support.gpu_check.report import Check, StepRecord
from tests.support.gpu_check.steps import Context, Step

GRACE_S = 2.0
# What the last steps (stopping agents) need even when the others used the time up.
MINIMUM_S = 3.0


class StepTimeout(Exception):
    pass


@contextmanager
def _interrupt_after(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: FrameType | None) -> None:
        raise StepTimeout(f"step interrupted after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_steps(
    steps: Sequence[Step],
    ctx: Context,
    total_s: float,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[StepRecord], None] = lambda record: None,
) -> list[StepRecord]:
    records = []
    deadline = clock() + total_s
    try:
        for step in steps:
            started = clock()
            budget = min(step.timeout_s, deadline - started)
            if budget < MINIMUM_S:
                checks = [Check(step.name, "skip", f"out of time ({total_s:.0f} s for the whole check)")]
            else:
                try:
                    with _interrupt_after(budget + GRACE_S):
                        checks = step.run(ctx, budget)
                except Exception as failure:
                    lines = traceback.format_exception_only(failure)[-1].strip()
                    checks = [Check(step.name, "fail", lines[-800:])]
            record = StepRecord(step.name, clock() - started, tuple(checks))
            records.append(record)
            progress(record)
    finally:
        ctx.close()
    return records
