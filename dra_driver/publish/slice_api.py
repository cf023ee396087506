"""The API calls the slice controller makes, through the official client, as raw JSON.

Raw JSON rather than the client's models: the controller compares what it sent with what the
server stored field by field (to notice dropped fields), and a model round trip would hide
exactly that. Every call goes through the client's REST layer (`kube_api.call`) rather than its
generated API classes, which would add their models to the agent's resident memory. Every
failure becomes one ApiCallError that says whether the write may have happened anyway, which
decides whether the controller must re-list before writing again.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from dra_driver.kube.k8s_status import status_reason_and_message
from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.publish.diff import JsonObject

# A write or a list that takes longer than this is treated as failed (and maybe applied).
REQUEST_TIMEOUT_SECONDS = 30.0
# The server ends each watch after this long; the client gives it a margin before giving up.
WATCH_SECONDS = 300
WATCH_READ_MARGIN_SECONDS = 30.0
EVENT_NAMESPACE = "default"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class ApiCallError(Exception):
    """A failed call; `status` 0 means no answer came (connection lost, timeout)."""

    def __init__(self, call: str, status: int, reason: str, message: str) -> None:
        answer = f"API server answered {status} {reason}" if status else "no answer"
        super().__init__(f"{call}: {answer}: {message}")
        self.call, self.status, self.reason = call, status, reason

    @property
    def expired(self) -> bool:
        return self.status == 410


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    object: JsonObject

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


class SliceApi:
    """ResourceSlices of one driver on one node, plus the few other objects the controller reads."""

    def __init__(self, client: KubeClient, driver_name: str, node_name: str) -> None:
        self._client = client
        self.node_name = node_name
        self.field_selector = f"spec.driver={driver_name},spec.nodeName={node_name}"

    async def _call(
        self, call: str, request: Awaitable[aiohttp.ClientResponse], expected: tuple[int, ...] = (200, 201)
    ) -> JsonObject:
        return await json_answer(call, request, expected)

    def _request(
        self,
        method: str,
        path: str,
        *,
        name: str | None = None,
        query: Sequence[tuple[str, str | int | bool]] = (),
        body: JsonObject | None = None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> Awaitable[aiohttp.ClientResponse]:
        path_params = {"name": name} if name is not None else None
        return call(
            self._client,
            method,
            path,
            path_params=path_params,
            query=query,
            body=body,
            request_timeout=timeout,
        )

    async def server_version(self) -> JsonObject:
        return await self._call("GET /version", self._request("GET", "/version/"))

    async def node_uid(self) -> str:
        node = await self._call(
            f"GET node {self.node_name}", self._request("GET", "/api/v1/nodes/{name}", name=self.node_name)
        )
        return str(node["metadata"]["uid"])

    async def list_slices(self) -> tuple[list[JsonObject], str]:
        """Our slices and the resourceVersion to watch from."""
        listed = await self._call(
            "LIST resourceslices",
            self._request("GET", SLICES_PATH, query=[("fieldSelector", self.field_selector)]),
        )
        return list(listed.get("items") or []), str(listed.get("metadata", {}).get("resourceVersion", ""))

    async def watch_slices(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch. Raises ApiCallError,
        with `expired` set when the version is too old and the caller must list again."""
        query: list[tuple[str, str | int | bool]] = [
            ("allowWatchBookmarks", True),
            ("fieldSelector", self.field_selector),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", WATCH_SECONDS),
            ("watch", True),
        ]
        async for event in watch_events(self._client, "WATCH resourceslices", SLICES_PATH, query):
            yield event

    async def create_slice(self, body: JsonObject) -> JsonObject:
        return await self._call("CREATE resourceslice", self._request("POST", SLICES_PATH, body=body))

    async def replace_slice(self, name: str, body: JsonObject) -> JsonObject:
        return await self._call(
            f"UPDATE resourceslice {name}",
            self._request("PUT", f"{SLICES_PATH}/{{name}}", name=name, body=body),
        )

    async def delete_slice(self, name: str, uid: str = "", resource_version: str = "") -> None:
        """Deletes only the very object we saw (uid and resourceVersion as preconditions);
        one already gone counts as deleted."""
        preconditions = {
            key: value for key, value in (("uid", uid), ("resourceVersion", resource_version)) if value
        }
        await self._call(
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
        await self._call(
            "CREATE event", self._request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body)
        )


async def json_answer(
    call: str, request: Awaitable[aiohttp.ClientResponse], expected: tuple[int, ...] = (200, 201)
) -> JsonObject:
    """The decoded JSON object of an answer with an expected status; else ApiCallError."""
    try:
        response = await request
        body = await response.read()
    except (aiohttp.ClientError, TimeoutError) as error:
        raise ApiCallError(call, 0, "", str(error) or type(error).__name__) from error
    if response.status not in expected:
        reason, message = status_reason_and_message(body)
        raise ApiCallError(call, response.status, reason, message)
    try:
        decoded = json.loads(body)
    except ValueError as error:
        raise ApiCallError(call, response.status, "", f"invalid JSON: {error}") from error
    if not isinstance(decoded, dict):
        raise ApiCallError(call, response.status, "", "expected a JSON object")
    return decoded


async def watch_events(
    client: KubeClient, call_name: str, path: str, query: Sequence[tuple[str, str | int | bool]]
) -> AsyncIterator[WatchEvent]:
    """The events of one watch request (`query` says what, from where, and `watch=true`) until the
    server ends it. Raises ApiCallError, `expired` set when the version is too old to watch from."""
    try:
        response = await call(
            client, "GET", path, query=query, request_timeout=WATCH_SECONDS + WATCH_READ_MARGIN_SECONDS
        )
    except (aiohttp.ClientError, TimeoutError) as error:
        raise ApiCallError(call_name, 0, "", str(error) or type(error).__name__) from error
    try:
        if response.status != 200:
            reason, message = status_reason_and_message(await response.read())
            raise ApiCallError(call_name, response.status, reason, message)
        while True:
            try:
                line = await response.content.readline()
            except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError) as error:
                raise ApiCallError(
                    call_name, 0, "", f"watch dropped: {error or type(error).__name__}"
                ) from error
            if not line:
                return
            yield _watch_event(call_name, line)
    finally:
        response.release()


def _watch_event(call: str, line: bytes) -> WatchEvent:
    try:
        decoded = json.loads(line)
        kind, obj = decoded["type"], decoded["object"]
    except (ValueError, KeyError, TypeError) as error:
        raise ApiCallError(call, 0, "", f"malformed watch event: {line[:200]!r}") from error
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise ApiCallError(call, 0, "", f"malformed watch event: {line[:200]!r}")
    if kind == "ERROR":
        raise ApiCallError(
            call, int(obj.get("code", 0) or 500), str(obj.get("reason", "")), str(obj.get("message", ""))
        )
    return WatchEvent(kind, obj)


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
