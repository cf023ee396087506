"""The rate-limited work queue: one worker per key at a time, backoff per key, a shared bucket."""

import asyncio

import pytest

from dra_driver.base.backoff import Backoff
from dra_driver.publish.workqueue import RateLimiter, ShutDown, WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_per_key_up_to_the_cap_and_forget_resets_it() -> None:
    limiter: RateLimiter[str] = RateLimiter(backoff=Backoff(first=0.01, cap=0.1), clock=FakeClock())

    delays = [limiter.when("a") for _ in range(6)]

    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])
    assert limiter.when("b") == pytest.approx(0.01), "another key has its own backoff"
    limiter.forget("a")
    assert limiter.failures("a") == 0
    assert limiter.when("a") == pytest.approx(0.01)


def test_the_bucket_limits_retries_of_all_keys_together() -> None:
    clock = FakeClock()
    limiter: RateLimiter[int] = RateLimiter(
        backoff=Backoff(first=0.001, cap=30.0), per_second=10, burst=3, clock=clock
    )

    delays = [limiter.when(key) for key in range(5)]

    assert delays[:3] == pytest.approx([0.001] * 3)
    assert delays[3:] == pytest.approx([0.1, 0.2]), "past the burst, 10 per second"
    clock.now += 10
    assert limiter.when(99) == pytest.approx(0.001), "the bucket refills with time"


async def _a_key_is_queued_once_and_re_added_keys_wait_for_the_worker() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("pool")
    queue.add("pool")
    key = await queue.get()
    queue.add("pool")  # arrives while being worked on

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)
    queue.done(key)

    assert await asyncio.wait_for(queue.get(), 1) == "pool"


async def test_a_key_is_queued_once_and_re_added_keys_wait_for_the_worker() -> None:
    await _a_key_is_queued_once_and_re_added_keys_wait_for_the_worker()


async def _add_after_keeps_the_earliest_time_and_add_rate_limited_backs_off() -> None:
    queue: WorkQueue[str] = WorkQueue(RateLimiter(backoff=Backoff(first=0.05, cap=30.0)))
    loop = asyncio.get_running_loop()
    queue.add_after("pool", 10)
    queue.add_after("pool", 0.02)
    queue.add_after("pool", 5)
    started = loop.time()

    await asyncio.wait_for(queue.get(), 1)
    assert loop.time() - started < 1
    queue.done("pool")

    assert queue.add_rate_limited("pool") == pytest.approx(0.05)
    assert queue.pending_retry("pool")
    await asyncio.wait_for(queue.get(), 1)
    queue.done("pool")
    assert queue.add_rate_limited("pool") == pytest.approx(0.1)


async def test_add_after_keeps_the_earliest_time_and_add_rate_limited_backs_off() -> None:
    await _add_after_keeps_the_earliest_time_and_add_rate_limited_backs_off()


async def _shut_down_wakes_waiting_workers_and_drops_timers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    waiter = asyncio.create_task(queue.get())
    queue.add_after("pool", 0.01)
    await asyncio.sleep(0)

    queue.shut_down()

    with pytest.raises(ShutDown):
        await asyncio.wait_for(waiter, 1)
    assert not queue.pending_retry("pool")


async def test_shut_down_wakes_waiting_workers_and_drops_timers() -> None:
    await _shut_down_wakes_waiting_workers_and_drops_timers()
