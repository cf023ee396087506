import asyncio

from dra_driver.state.keyed_locks import KeyedLocks


async def test_one_key_is_exclusive_and_other_keys_run_alongside() -> None:
    async def scenario() -> list[str]:
        locks = KeyedLocks()
        events: list[str] = []

        async def hold(key: str, name: str) -> None:
            async with locks.hold(key):
                events.append(f"{name} in")
                await asyncio.sleep(0.01)
                events.append(f"{name} out")

        await asyncio.gather(hold("a", "a1"), hold("a", "a2"), hold("b", "b1"))
        assert len(locks) == 0  # nothing kept once nobody holds or waits
        return events

    events = await scenario()
    assert events.index("a1 out") < events.index("a2 in")
    assert events.index("b1 in") < events.index("a1 out")


async def test_a_failing_holder_releases_the_key() -> None:
    async def scenario() -> int:
        locks = KeyedLocks()

        async def fail() -> None:
            async with locks.hold("a"):
                raise ValueError("boom")

        results = await asyncio.gather(fail(), fail(), return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results)
        return len(locks)

    assert await scenario() == 0


async def test_a_waiter_cancelled_before_its_turn_leaves_no_key_behind() -> None:
    async def scenario() -> list[int]:
        locks = KeyedLocks()
        held = asyncio.Event()
        release = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("a"):
                held.set()
                await release.wait()

        async def waiter() -> None:
            async with locks.hold("a"):
                raise AssertionError("a cancelled waiter never holds the key")

        first = asyncio.create_task(holder())
        await held.wait()
        second = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        sizes = [len(locks)]
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        release.set()
        await first
        return [*sizes, len(locks)]

    assert await scenario() == [1, 0]
