"""The calls the slice controller makes: the ResourceSlices of one driver on one node, plus the
few other objects it reads (the server's version, the Node's UID) and the Events it posts.

No error handling here: every call raises `ApiError` (`kube.calls`), whose `no_answer` tells the
controller that a write may have happened anyway and it must list again before writing.
"""

from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime

from dra_driver.base.json_object import JsonObject
from dra_driver.kube.calls import WatchEvent, json_call, watch_events, watch_query
from dra_driver.kube.http_wire import HttpAnswer
from dra_driver.kube.kube_api import KubeClient, Query, call
from dra_driver.kube.timeouts import TIMEOUTS

EVENT_NAMESPACE = "default"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class SliceApi:
    def __init__(self, client: KubeClient, driver_name: str, node_name: str) -> None:
        self._client = client
        self.node_name = node_name
        self.field_selector = f"spec.driver={driver_name},spec.nodeName={node_name}"

    def _request(
        self,
        method: str,
        path: str,
        *,
        name: str | None = None,
        query: Query = (),
        body: JsonObject | None = None,
    ) -> Awaitable[HttpAnswer]:
        path_params = {"name": name} if name is not None else None
        return call(
            self._client,
            method,
            path,
            path_params=path_params,
            query=query,
            body=body,
            request_timeout=TIMEOUTS.request,
        )

    async def server_version(self) -> JsonObject:
        return await json_call("GET /version", self._request("GET", "/version/"))

    async def node_uid(self) -> str:
        node = await json_call(
            f"GET node {self.node_name}", self._request("GET", "/api/v1/nodes/{name}", name=self.node_name)
        )
        return str(node["metadata"]["uid"])

    async def list_slices(self) -> tuple[list[JsonObject], str]:
        """Our slices and the resourceVersion to watch from."""
        listed = await json_call(
            "LIST resourceslices",
            self._request("GET", SLICES_PATH, query=[("fieldSelector", self.field_selector)]),
        )
        return list(listed.get("items") or []), str(listed.get("metadata", {}).get("resourceVersion", ""))

    def watch_slices(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch."""
        return watch_events(
            self._client,
            "WATCH resourceslices",
            SLICES_PATH,
            watch_query(self.field_selector, resource_version),
        )

    async def create_slice(self, body: JsonObject) -> JsonObject:
        return await json_call("CREATE resourceslice", self._request("POST", SLICES_PATH, body=body))

    async def replace_slice(self, name: str, body: JsonObject) -> JsonObject:
        return await json_call(
            f"UPDATE resourceslice {name}",
            self._request("PUT", f"{SLICES_PATH}/{{name}}", name=name, body=body),
        )

    async def delete_slice(self, name: str, uid: str = "", resource_version: str = "") -> None:
        """Deletes only the very object we saw (uid and resourceVersion as preconditions);
        one already gone counts as deleted."""
        preconditions = {
            key: value for key, value in (("uid", uid), ("resourceVersion", resource_version)) if value
        }
        await json_call(
            f"DELETE resourceslice {name}",
            self._request(
                "DELETE",
                f"{SLICES_PATH}/{{name}}",
                name=name,
                body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions},
            ),
            expected=(200, 202, 404),
        )

    async def create_node_event(self, node_uid: str, reason: str, message: str, kind: str) -> None:
        """A core/v1 Event on our Node, where `kubectl describe node` shows it."""
        body = node_event(self.node_name, node_uid, reason, message, kind)
        await json_call(
            "CREATE event", self._request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body)
        )


def node_event(node_name: str, node_uid: str, reason: str, message: str, kind: str) -> JsonObject:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node_name}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid},
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": "dra-driver", "host": node_name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": "dra-driver",
        "reportingInstance": node_name,
    }
