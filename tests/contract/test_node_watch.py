"""The agent's watch of its own Node, against the stand-in API server through the agent's client:
it sees label changes of its Node only, and keeps seeing them through dropped and expired watches
and failing lists."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from dra_driver.agent.node_watch import NodeFacts, follow_node
from dra_driver.base.backoff import Backoff
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.node_api import NodeApi
from dra_driver.kube.server_access import ServerAccess
from tests.support.agent import NODE_NAME
from tests.support.apiserver import ApiServer
from tests.support.publishing import add_node, json_request
from tests.support.waiting import until

LABEL = "dra-driver.dev/config"


def set_label(server: ApiServer, node: str, value: str | None) -> None:
    """As `kubectl label node` does: the stored Node, changed, written back (read from the store,
    so that faults injected into GETs hit the agent only)."""
    url = f"{server.url}/api/v1/nodes/{node}"
    (stored,) = (obj for obj in server.objects("nodes") if obj["metadata"]["name"] == node)
    labels = stored["metadata"].setdefault("labels", {})
    if value is None:
        labels.pop(LABEL, None)
    else:
        labels[LABEL] = value
    json_request("PUT", url, stored)


@asynccontextmanager
async def following(server: ApiServer) -> AsyncIterator[list[NodeFacts]]:
    seen: list[NodeFacts] = []
    client = KubeClient(ServerAccess(server.url))
    task = asyncio.create_task(
        follow_node(NodeApi(client, NODE_NAME), seen.append, Backoff(first=0.01, cap=30.0))
    )
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def label_seen(seen: list[NodeFacts], value: str | None) -> bool:
    return bool(seen) and seen[-1].labels.get(LABEL) == value


async def test_label_changes_of_its_own_node_are_seen(apiserver: ApiServer) -> None:
    add_node(apiserver, "node-b")
    await _own_node_only(apiserver)
    assert apiserver.request_count("WATCH", "nodes") >= 1


async def _own_node_only(apiserver: ApiServer) -> None:
    async with following(apiserver) as seen:
        await until(lambda: len(seen) == 1)
        assert seen[0].exists and seen[0].uid and LABEL not in seen[0].labels
        set_label(apiserver, NODE_NAME, "a100")
        await until(lambda: label_seen(seen, "a100"))
        count = len(seen)
        set_label(apiserver, "node-b", "other")  # another node: not watched
        set_label(apiserver, NODE_NAME, None)
        await until(lambda: label_seen(seen, None) and len(seen) > count)
        assert all(facts.labels.get(LABEL) != "other" for facts in seen)


@pytest.mark.parametrize("break_it", ["drop", "expire", "compacted"])
async def test_the_watch_survives_the_api_server(apiserver: ApiServer, break_it: str) -> None:
    await _survives(apiserver, break_it)


async def _survives(apiserver: ApiServer, break_it: str) -> None:
    async with following(apiserver) as seen:
        await until(lambda: len(seen) == 1 and apiserver.open_watches == 1)
        if break_it == "drop":
            apiserver.drop_watches()
            set_label(apiserver, NODE_NAME, "l4")
        elif break_it == "expire":
            apiserver.expire_watches()
            set_label(apiserver, NODE_NAME, "l4")
        else:
            # The label changes while the watch is down and the history is compacted away: the
            # agent must list again, and the first two lists fail too.
            apiserver.faults.fail_next, apiserver.faults.fail_methods = 10**6, frozenset({"WATCH"})
            apiserver.drop_watches()
            set_label(apiserver, NODE_NAME, "l4")
            apiserver.compact()
            apiserver.faults.fail_next, apiserver.faults.fail_methods = 2, frozenset({"GET"})
        await until(lambda: label_seen(seen, "l4"))
        await until(lambda: apiserver.open_watches == 1)
        set_label(apiserver, NODE_NAME, "a100")
        await until(lambda: label_seen(seen, "a100"))
