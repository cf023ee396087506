"""The one retry schedule: doubling from `first`, capped, spread by jitter within its bounds."""

import pytest

from dra_driver.base.backoff import Backoff
from dra_driver.claims.status import status_writer
from dra_driver.hardware import nvml_wait
from dra_driver.publish import controller, workqueue


def test_it_doubles_from_first_up_to_the_cap() -> None:
    backoff = Backoff(first=0.5, cap=5.0)

    assert [backoff.delay(failures) for failures in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_count_below_one_waits_as_the_first_failure() -> None:
    assert Backoff(first=0.25, cap=1.0).delay(0) == 0.25


def test_an_outage_of_any_length_stays_at_the_cap() -> None:
    """2.0 ** 5000 would overflow a float: the exponent is bounded first."""
    assert Backoff(first=0.1, cap=30.0).delay(5000) == 30.0


@pytest.mark.parametrize(("uniform", "factor"), [(0.0, 0.8), (0.5, 1.0), (0.999999, 1.2)])
def test_jitter_spreads_each_wait_within_its_share(uniform: float, factor: float) -> None:
    backoff = Backoff(first=1.0, cap=8.0, jitter=0.2, uniform=lambda: uniform)

    assert backoff.delay(3) == pytest.approx(4.0 * factor, rel=1e-5)
    assert backoff.delay(10) == pytest.approx(8.0 * factor, rel=1e-5), "the spread applies to the cap too"


def test_jitter_from_the_real_random_source_stays_within_bounds() -> None:
    backoff = Backoff(first=0.5, cap=60.0, jitter=0.2)

    delays = [backoff.delay(2) for _ in range(2000)]

    assert all(0.8 <= delay <= 1.2 for delay in delays)
    assert max(delays) - min(delays) > 0.2, "the waits of many retries differ"


@pytest.mark.parametrize(
    ("first", "cap", "jitter", "message"),
    [
        (0.0, 1.0, 0.0, "expected 0 < first <= cap, got first=0.0, cap=1.0"),
        (2.0, 1.0, 0.0, "expected 0 < first <= cap, got first=2.0, cap=1.0"),
        (1.0, 2.0, 1.0, "expected 0 <= jitter < 1, got 1.0"),
    ],
)
def test_a_schedule_that_cannot_be_is_refused(first: float, cap: float, jitter: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(first, cap, jitter)


def test_each_loop_keeps_its_schedule() -> None:
    """The values each retrying loop had before it used this formula (issue 31)."""
    assert Backoff(first=0.005, cap=30.0) == workqueue.RETRY
    assert Backoff(first=0.1, cap=30.0) == controller.WATCH_RETRY
    assert status_writer.RETRY.first == 0.5 and status_writer.RETRY.cap == 60.0
    assert status_writer.RETRY.jitter == 0.2
    assert Backoff(first=1.0, cap=60.0) == nvml_wait.RETRY
