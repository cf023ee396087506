"""One JSON call and one watch-event stream: every API conversation of the agent goes through them.

Raw JSON rather than the client's models: the slice controller compares what it sent with what
the server stored field by field (to notice dropped fields), the engine checks a claim's fields
itself with precise messages, and the models would join the agent's resident memory
(`kube_api`). Whatever goes wrong becomes an `ApiError` here, so the façades above (`slice_api`,
`pod_api`, `node_api`, `claim_api`) carry no error handling of their own.
"""

from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

import msgspec

from dra_driver.base.json_object import JsonObject
from dra_driver.kube.errors import TRANSPORT_ERRORS, ApiError
from dra_driver.kube.http_wire import HttpAnswer
from dra_driver.kube.kube_api import KubeClient, Query, call, open_watch
from dra_driver.kube.kube_http import HttpStream
from dra_driver.kube.timeouts import TIMEOUTS

_Answer = TypeVar("_Answer", HttpAnswer, HttpStream, bytes)


class WatchEvent(msgspec.Struct, frozen=True):
    kind: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    object: JsonObject

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


def decoded_answer(call_name: str, status: int, body: bytes, expected: tuple[int, ...]) -> object:
    """The parsed JSON of an answer with an expected status; else ApiError."""
    if status not in expected:
        raise ApiError.from_answer(call_name, status, body)
    try:
        return msgspec.json.decode(body)
    except ValueError as error:
        raise ApiError(call_name, status, "", f"invalid JSON: {error}") from error


async def _answered(call_name: str, request: Awaitable[_Answer]) -> _Answer:
    """What `request` gives, or the ApiError of no answer."""
    try:
        return await request
    except TRANSPORT_ERRORS as error:
        raise ApiError.from_transport(call_name, error) from error


async def json_call(
    call_name: str, request: Awaitable[HttpAnswer], expected: tuple[int, ...] = (200, 201)
) -> JsonObject:
    """The JSON object `request` (a `kube_api.call` not yet awaited) is answered with."""
    answer = await _answered(call_name, request)
    decoded = decoded_answer(call_name, answer.status, answer.body, expected)
    if not isinstance(decoded, dict):
        raise ApiError(call_name, answer.status, "", "expected a JSON object")
    return decoded


async def json_get(
    client: KubeClient, call_name: str, path: str, path_params: Mapping[str, str], request_timeout: float
) -> object:
    """A GET answered as parsed JSON of any shape: the caller checks the fields itself (the
    claim of a prepare)."""
    request = call(client, "GET", path, path_params=path_params, request_timeout=request_timeout)
    answer = await _answered(call_name, request)
    return decoded_answer(call_name, answer.status, answer.body, (200,))


def watch_query(field_selector: str, resource_version: str) -> list[tuple[str, str | int | bool]]:
    """A watch from `resource_version` of what `field_selector` selects, with bookmarks, ended by
    the server after `TIMEOUTS.watch`."""
    return [
        ("allowWatchBookmarks", True),
        ("fieldSelector", field_selector),
        ("resourceVersion", resource_version),
        ("timeoutSeconds", TIMEOUTS.watch),
        ("watch", True),
    ]


async def watch_events(
    client: KubeClient, call_name: str, path: str, query: Query
) -> AsyncIterator[WatchEvent]:
    """The events of one watch request (`query` says what, from where, and `watch=true`) until the
    server ends it. Raises ApiError, `expired` when the version is too old to watch from."""
    watch_time = TIMEOUTS.watch + TIMEOUTS.watch_read_margin
    stream = await _answered(call_name, open_watch(client, path, query, watch_time))
    try:
        if stream.status != 200:
            body = await _answered(call_name, stream.read_all())
            raise ApiError.from_answer(call_name, stream.status, body)
        while True:
            try:
                line = await stream.readline()
            except TRANSPORT_ERRORS as error:
                raise ApiError(call_name, 0, "", f"watch dropped: {error or type(error).__name__}") from error
            if not line:
                return
            yield _watch_event(call_name, line)
    finally:
        stream.close()


def _watch_event(call_name: str, line: bytes) -> WatchEvent:
    try:
        decoded = msgspec.json.decode(line)
        kind, obj = decoded["type"], decoded["object"]
    except (ValueError, KeyError, TypeError) as error:
        raise ApiError(call_name, 0, "", f"malformed watch event: {line[:200]!r}") from error
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise ApiError(call_name, 0, "", f"malformed watch event: {line[:200]!r}")
    if kind == "ERROR":
        raise ApiError(
            call_name, int(obj.get("code", 0) or 500), str(obj.get("reason", "")), str(obj.get("message", ""))
        )
    return WatchEvent(kind, obj)
