import asyncio

from dra_driver.state.keyed_locks import KeyedLocks


def test_one_key_is_exclusive_and_other_keys_run_alongside() -> None:
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

    events = asyncio.run(scenario())
    assert events.index("a1 out") < events.index("a2 in")
    assert events.index("b1 in") < events.index("a1 out")


def test_a_failing_holder_releases_the_key() -> None:
    async def scenario() -> int:
        locks = KeyedLocks()

        async def fail() -> None:
            async with locks.hold("a"):
                raise ValueError("boom")

        results = await asyncio.gather(fail(), fail(), return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results)
        return len(locks)

    assert asyncio.run(scenario()) == 0
