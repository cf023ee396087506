"""The one list-and-watch loop: a 410 lists again at once, any other failure waits the backoff
(longer each time in a row, from the start after an event), bookmarks move the position only.
Scripted watches for the schedule; the stand-in API server for the real 410."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import structlog

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import ClaimFault, DriverError, OperatorFault, TransientFault
from dra_driver.kube.calls import WatchEvent
from dra_driver.kube.errors import ApiError
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.node_api import NodeApi
from dra_driver.kube.server_access import ServerAccess
from dra_driver.kube.watching import WatchPosition, list_and_watch
from tests.support.agent import NODE_NAME
from tests.support.apiserver import ApiServer
from tests.support.waiting import until

log = structlog.get_logger("tests.watching")
BACKOFF = Backoff(first=1.0, cap=4.0)


def event(kind: str, version: str) -> WatchEvent:
    return WatchEvent(kind, {"metadata": {"name": "n", "resourceVersion": version}})


class Script:
    """Each watch plays the next entry: events, then the exception (None: the server ends it).
    The loop is stopped (cancelled) when the script runs out."""

    def __init__(self, watches: list[tuple[list[WatchEvent], Exception | None]]) -> None:
        self.watches = watches
        self.lists = 0
        self.watched_from: list[str] = []
        self.seen: list[str] = []
        self.slept: list[float] = []

    async def relist(self) -> str:
        self.lists += 1
        return f"list-{self.lists}"

    async def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        self.watched_from.append(resource_version)
        if not self.watches:
            raise asyncio.CancelledError
        events, ending = self.watches.pop(0)
        for each in events:
            yield each
        if ending is not None:
            raise ending

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    async def run(self, position: WatchPosition | None = None) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await list_and_watch(
                self.relist,
                self.watch,
                lambda seen: self.seen.append(f"{seen.kind} {seen.resource_version}"),
                backoff=BACKOFF,
                log=log,
                what="test",
                position=position,
                sleep=self.sleep,
            )


def failed(status: int) -> ApiError:
    return ApiError("WATCH things", status, "", "scripted")


async def test_an_expired_watch_lists_again_at_once() -> None:
    script = Script([([event("ADDED", "5")], failed(410)), ([], None)])

    await script.run()

    assert script.lists == 2
    assert script.watched_from == ["list-1", "list-2", "list-2"]
    assert script.slept == []


async def test_failures_in_a_row_wait_longer_and_an_event_starts_the_backoff_again() -> None:
    script = Script(
        [
            ([], failed(0)),
            ([], failed(500)),
            ([], failed(0)),
            ([], failed(0)),
            ([event("MODIFIED", "7")], failed(503)),
        ]
    )

    await script.run()

    assert script.slept == [1.0, 2.0, 4.0, 4.0, 1.0]
    assert script.lists == 1, "only an expired watch lists again"
    assert script.watched_from == ["list-1"] * 5 + ["7"]


async def test_a_failing_list_waits_the_backoff_too() -> None:
    calls: list[str] = []

    async def relist() -> str:
        calls.append("list")
        if len(calls) < 3:
            raise failed(503)
        return "9"

    script = Script([])
    script.relist = relist  # type: ignore[method-assign]
    await script.run()

    assert script.slept == [1.0, 2.0]
    assert script.watched_from == ["9"]


async def test_bookmarks_move_the_position_and_reach_nobody() -> None:
    position = WatchPosition()
    script = Script([([event("BOOKMARK", "11"), event("ADDED", "12"), event("BOOKMARK", "20")], None)])

    await script.run(position)

    assert script.seen == ["ADDED 12"]
    assert script.watched_from == ["list-1", "20"]
    assert position.resource_version == "20"


async def test_a_position_someone_else_listed_for_is_watched_from_without_a_list() -> None:
    script = Script([([], None)])

    await script.run(WatchPosition("42"))

    assert script.lists == 0
    assert script.watched_from[0] == "42"


async def test_against_the_api_server_an_expired_watch_lists_again(apiserver: ApiServer) -> None:
    await _expired_against_the_server(apiserver)


async def _expired_against_the_server(apiserver: ApiServer) -> None:
    client = KubeClient(ServerAccess(apiserver.url))
    api = NodeApi(client, NODE_NAME)
    slept: list[float] = []
    lists: list[str] = []

    async def relist() -> str:
        _node, version = await api.list_node()
        lists.append(version)
        return version

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(0)

    loop = asyncio.create_task(
        list_and_watch(relist, api.watch_node, _ignore, backoff=BACKOFF, log=log, what="node", sleep=sleep)
    )
    try:
        await until(lambda: len(lists) == 1 and apiserver.open_watches == 1)
        apiserver.expire_watches()
        await until(lambda: len(lists) == 2 and apiserver.open_watches == 1)
        assert slept == [], "a 410 is no failure: no wait"
        apiserver.faults.fail_next, apiserver.faults.fail_methods = 2, frozenset({"GET"})
        apiserver.expire_watches()
        await until(lambda: len(lists) == 3 and apiserver.open_watches == 1)
        assert slept == [1.0, 2.0], "the two failed lists waited the backoff"
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await client.close()


def _ignore(_event: WatchEvent) -> None:
    pass


def _relist_failing_with(first: Exception) -> tuple[list[str], Script]:
    calls: list[str] = []

    async def relist() -> str:
        calls.append("list")
        if len(calls) == 1:
            raise first
        return "9"

    script = Script([])
    script.relist = relist  # type: ignore[method-assign]
    return calls, script


async def test_a_transient_fault_of_the_list_that_is_no_api_error_waits_the_backoff_too() -> None:
    """The slice controller's list raises OutdatedList, a TransientFault of its own: retried by
    its branch, not only an ApiError (before, a list that raised one would have ended the watch
    task, in silence)."""
    calls, script = _relist_failing_with(TransientFault("LIST things: answered at 3, older than 5"))
    await script.run()

    assert (calls, script.slept) == (["list", "list"], [1.0])


async def test_the_servers_final_answer_is_tried_again_by_the_watch() -> None:
    """403 (RBAC lacks watch) or 404 (the resource not served): fixed outside the agent, and seen
    at the next try (kube/errors.py, KEPT_TRYING)."""
    script = Script([([], failed(403)), ([], failed(404)), ([], None)])

    await script.run()

    assert script.slept == [1.0, 2.0]


@pytest.mark.parametrize("fault", [ClaimFault("not the watch's"), OperatorFault("--flag: wrong")])
async def test_a_claim_or_operator_fault_that_is_no_api_answer_ends_the_loop(fault: DriverError) -> None:
    calls, script = _relist_failing_with(fault)

    with pytest.raises(type(fault)):
        await script.run()
    assert (calls, script.slept) == (["list"], [])
