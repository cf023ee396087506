"""List and watch of one Node, selected by name (a watch of one object by its path is not
something the API offers). Each call raises `ApiError` (`kube.calls`)."""

from collections.abc import AsyncIterator

from dra_driver.base.json_object import JsonObject
from dra_driver.kube.calls import WatchEvent, json_call, watch_events, watch_query
from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.kube.timeouts import TIMEOUTS

NODES_PATH = "/api/v1/nodes"


class NodeApi:
    def __init__(self, client: KubeClient, node_name: str) -> None:
        self._client = client
        self.node_name = node_name
        self._selector = f"metadata.name={node_name}"

    async def list_node(self) -> tuple[JsonObject | None, str]:
        """The Node (None if there is none) and the resourceVersion to watch from."""
        listed = await json_call(
            "LIST nodes",
            call(
                self._client,
                "GET",
                NODES_PATH,
                query=[("fieldSelector", self._selector)],
                request_timeout=TIMEOUTS.request,
            ),
            expected=(200,),
        )
        items = listed.get("items") or []
        return (items[0] if items else None), str(listed.get("metadata", {}).get("resourceVersion", ""))

    def watch_node(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return watch_events(
            self._client, "WATCH nodes", NODES_PATH, watch_query(self._selector, resource_version)
        )
