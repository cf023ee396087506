"""The agent's own Node, followed by list + watch (fieldSelector metadata.name=<node>): its
labels name the node's config, and its UID is what Events about the node refer to.

Like the slice controller's watch it survives the API server (`kube.watching`): every (re)list
reports the Node as it is, so nothing a lost watch missed stays missed.
"""

from collections.abc import Callable

import msgspec
import structlog

from dra_driver.base.backoff import Backoff
from dra_driver.base.json_object import JsonObject
from dra_driver.kube.calls import WatchEvent
from dra_driver.kube.node_api import NodeApi
from dra_driver.kube.watching import list_and_watch

log = structlog.get_logger("dra_driver.node_watch")

RETRY = Backoff(first=0.1, cap=30.0)


class NodeFacts(msgspec.Struct, frozen=True):
    """What the agent takes from its Node object; `exists` False while there is none."""

    exists: bool
    uid: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)


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


async def follow_node(api: NodeApi, on_change: Callable[[NodeFacts], None], backoff: Backoff = RETRY) -> None:
    """Calls `on_change` with the Node's facts after each list and each change the watch shows,
    until cancelled. Most Node updates are status heartbeats; the caller compares what it needs."""

    async def relist() -> str:
        obj, resource_version = await api.list_node()
        on_change(node_facts(obj))
        return resource_version

    def on_event(event: WatchEvent) -> None:
        on_change(node_facts(None if event.kind == "DELETED" else event.object))

    await list_and_watch(relist, api.watch_node, on_event, backoff=backoff, log=log, what="node")
