"""The agent's own Node, followed by list + watch (fieldSelector metadata.name=<node>): its
labels name the node's config, and its UID is what Events about the node refer to.

Like the slice controller's watch it survives the API server: a failed list or watch is retried
with exponential backoff, an expired watch lists again, and every (re)list reports the Node as
it is, so nothing a lost watch missed stays missed.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import structlog

from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.publish.diff import JsonObject
from dra_driver.publish.slice_api import (
    REQUEST_TIMEOUT_SECONDS,
    WATCH_SECONDS,
    ApiCallError,
    WatchEvent,
    json_answer,
    watch_events,
)

log = structlog.get_logger("dra_driver.node_watch")

NODES_PATH = "/api/v1/nodes"
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the agent takes from its Node object; `exists` False while there is none."""

    exists: bool
    uid: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def node_facts(obj: JsonObject | None) -> NodeFacts:
    if obj is None:
        return NodeFacts(exists=False)
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return NodeFacts(
        exists=True,
        uid=str(metadata.get("uid", "")),
        labels={str(key): str(value) for key, value in labels.items()},
    )


class NodeApi:
    """List and watch of one Node, selected by name (a watch of one object by its path is not
    something the API offers)."""

    def __init__(self, client: KubeClient, node_name: str) -> None:
        self._client = client
        self.node_name = node_name
        self._selector = f"metadata.name={node_name}"

    async def list_node(self) -> tuple[JsonObject | None, str]:
        """The Node (None if there is none) and the resourceVersion to watch from."""
        listed = await json_answer(
            "LIST nodes",
            call(
                self._client,
                "GET",
                NODES_PATH,
                query=[("fieldSelector", self._selector)],
                request_timeout=REQUEST_TIMEOUT_SECONDS,
            ),
            expected=(200,),
        )
        items = listed.get("items") or []
        return (items[0] if items else None), str(listed.get("metadata", {}).get("resourceVersion", ""))

    def watch_node(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        query: list[tuple[str, str | int | bool]] = [
            ("allowWatchBookmarks", True),
            ("fieldSelector", self._selector),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", WATCH_SECONDS),
            ("watch", True),
        ]
        return watch_events(self._client, "WATCH nodes", NODES_PATH, query)


async def follow_node(
    api: NodeApi,
    on_change: Callable[[NodeFacts], None],
    retry_first: float = RETRY_FIRST_SECONDS,
    retry_max: float = RETRY_MAX_SECONDS,
) -> None:
    """Calls `on_change` with the Node's facts after each list and each change the watch shows,
    until cancelled. Most Node updates are status heartbeats; the caller compares what it needs."""
    failures = 0
    watch_from: str | None = None
    while True:
        try:
            if watch_from is None:
                obj, watch_from = await api.list_node()
                on_change(node_facts(obj))
            async for event in api.watch_node(watch_from):
                failures = 0
                watch_from = event.resource_version or watch_from
                if event.kind == "BOOKMARK":
                    continue
                on_change(node_facts(None if event.kind == "DELETED" else event.object))
            # The server ended the watch (its timeout): go on from where it stopped.
        except ApiCallError as error:
            if error.expired:
                log.info("node watch expired; listing again", error=str(error))
                watch_from = None
                continue
            failures += 1
            delay = min(retry_first * 2 ** (failures - 1), retry_max)
            log.warning("node watch failed; retrying", error=str(error), retry_in_seconds=delay)
            await asyncio.sleep(delay)
