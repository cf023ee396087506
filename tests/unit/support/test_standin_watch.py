"""Watches of the stand-in API server, read the ways the driver and the official clients read them."""

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client, config, watch
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config
from kubernetes.aio import watch as aio_watch

from tests.support import apiserver
from tests.support.apiserver import ApiServer
from tests.support.waiting import wait_until
from tests.unit.support.test_standin_apiserver import EVENTS, SLICES, event_body, raw, slice_body

Event = tuple[str, dict[str, Any]]


@pytest.fixture
def server() -> Iterator[ApiServer]:
    started = ApiServer().start()
    started.bookmark_interval_seconds = 0.05
    yield started
    started.stop()


@pytest.fixture
def kubeconfig(server: ApiServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(str(kubeconfig))
    yield api_client
    api_client.close()


@contextlib.asynccontextmanager
async def aio_slices(kubeconfig: Path) -> AsyncIterator[Any]:
    configuration = aio_client.Configuration()
    await aio_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with aio_client.ApiClient(configuration) as api_client:
        yield aio_client.ResourceV1Api(api_client)


def create(server: ApiServer, body: dict[str, Any], path: str = SLICES) -> dict[str, Any]:
    code, created = raw(server, "POST", path, body)
    assert code == 201, created
    return created


def current_version(server: ApiServer, path: str = SLICES) -> str:
    return str(raw(server, "GET", path)[1]["metadata"]["resourceVersion"])


def first_events(list_function: Callable[..., Any], count: int, **options: Any) -> list[Event]:
    """(type, object) of the first `count` events through the sync client's Watch; the timeout only
    ends a watch that gets fewer, so that the test fails rather than hangs."""
    stream = watch.Watch()
    events: list[Event] = []
    for event in stream.stream(list_function, timeout_seconds=5, **options):
        events.append((event["type"], event["raw_object"]))
        if len(events) == count:
            stream.stop()
    return events


def summary(events: list[Event]) -> list[tuple[str, str]]:
    return [(kind, obj["metadata"].get("name", "")) for kind, obj in events]


def test_the_sync_client_watches_from_a_resource_version(
    server: ApiServer, api_client: client.ApiClient
) -> None:
    a = create(server, slice_body("node-a"))
    since = current_version(server)
    b = create(server, slice_body("node-a"))
    raw(server, "PUT", f"{SLICES}/{a['metadata']['name']}", a)
    create(server, slice_body("node-b"))
    raw(server, "DELETE", f"{SLICES}/{b['metadata']['name']}")

    events = first_events(
        client.ResourceV1Api(api_client).list_resource_slice,
        3,
        field_selector="spec.nodeName=node-a",
        resource_version=since,
    )

    name_a, name_b = a["metadata"]["name"], b["metadata"]["name"]
    assert summary(events) == [("ADDED", name_b), ("MODIFIED", name_a), ("DELETED", name_b)]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions == sorted(versions) and versions[0] > int(since)
    assert server.request_count("WATCH", "resourceslices") == 1


def test_a_watch_without_resource_version_starts_with_the_current_objects(
    server: ApiServer, api_client: client.ApiClient
) -> None:
    existing = sorted(create(server, slice_body())["metadata"]["name"] for _ in range(2))

    def create_once_watched() -> None:
        wait_until(lambda: server.open_watches == 1)
        create(server, slice_body("node-b"))

    creator = threading.Thread(target=create_once_watched)
    creator.start()
    events = first_events(client.ResourceV1Api(api_client).list_resource_slice, 3)
    creator.join()

    assert summary(events)[:2] == [("ADDED", name) for name in existing]
    assert events[2][0] == "ADDED" and events[2][1]["spec"]["nodeName"] == "node-b"


def test_objects_moving_in_and_out_of_a_selection_are_added_and_deleted(
    server: ApiServer, api_client: client.ApiClient
) -> None:
    event = create(server, event_body("Started"), EVENTS)
    path, since = f"{EVENTS}/{event['metadata']['name']}", event["metadata"]["resourceVersion"]
    for reason, message in (("Failed", "m"), ("Failed", "again"), ("Started", "again")):
        _, event = raw(server, "PUT", path, {**event, "reason": reason, "message": message})

    events = first_events(
        client.CoreV1Api(api_client).list_namespaced_event,
        3,
        namespace="default",
        field_selector="reason=Failed",
        resource_version=since,
    )

    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    # The DELETED event carries the last content that matched, at the revision that moved it out.
    assert (events[2][1]["reason"], events[2][1]["message"]) == ("Failed", "again")
    assert events[2][1]["metadata"]["resourceVersion"] == event["metadata"]["resourceVersion"]


def test_a_watch_from_before_a_compaction_gets_410(server: ApiServer, api_client: client.ApiClient) -> None:
    since = create(server, slice_body())["metadata"]["resourceVersion"]
    create(server, slice_body())
    server.compact()

    with pytest.raises(client.ApiException) as expired:
        first_events(client.ResourceV1Api(api_client).list_resource_slice, 1, resource_version=since)

    assert expired.value.status == 410
    assert f"Expired: too old resource version: {since} ({current_version(server)})" in expired.value.reason
    since = current_version(server)  # a watch from the compaction on still works
    name = create(server, slice_body())["metadata"]["name"]
    events = first_events(client.ResourceV1Api(api_client).list_resource_slice, 1, resource_version=since)
    assert summary(events) == [("ADDED", name)]


def test_the_history_keeps_a_bounded_number_of_changes(
    server: ApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apiserver, "HISTORY_LIMIT", 2)
    versions = [create(server, slice_body())["metadata"]["resourceVersion"] for _ in range(4)]
    slices = client.ResourceV1Api(api_client)

    assert len(first_events(slices.list_resource_slice, 2, resource_version=versions[1])) == 2
    with pytest.raises(
        client.ApiException, match=rf"too old resource version: {versions[0]} \({versions[1]}\)"
    ):
        first_events(slices.list_resource_slice, 1, resource_version=versions[0])


def test_fail_after_commit_still_tells_watchers(server: ApiServer, api_client: client.ApiClient) -> None:
    since = current_version(server)
    server.faults.fail_after_commit_next = 1
    assert raw(server, "POST", SLICES, slice_body())[0] == 500

    events = first_events(client.ResourceV1Api(api_client).list_resource_slice, 1, resource_version=since)

    assert [kind for kind, _ in events] == ["ADDED"]


async def read_events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    return [json.loads(await response.content.readline()) for _ in range(count)]


def version_of(event: dict[str, Any]) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


async def events_until_bookmark(response: aiohttp.ClientResponse, version: int) -> list[dict[str, Any]]:
    """Events up to the first bookmark at `version` or later (bookmarks come every 50 ms here)."""
    events: list[dict[str, Any]] = []
    while len(events) < 100:
        events += await read_events(response, 1)
        if events[-1]["type"] == "BOOKMARK" and version_of(events[-1]) >= version:
            return events
    raise AssertionError(f"no bookmark at {version} in {events}")


async def test_raw_aio_lines_carry_live_events_and_bookmarks(server: ApiServer, kubeconfig: Path) -> None:
    since = current_version(server)

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        async with aio_slices(kubeconfig) as slices:
            response = await slices.list_resource_slice_without_preload_content(
                watch=True,
                resource_version=since,
                allow_watch_bookmarks=True,
                field_selector="spec.nodeName=node-a",
            )
            assert (response.status, response.content_type) == (200, "application/json")
            first = await read_events(response, 1)
            created = await slices.create_resource_slice(slice_body("node-a"))
            await slices.create_resource_slice(slice_body("node-b"))
            version = int(created.metadata.resource_version)
            later = await events_until_bookmark(response, version + 1)
            response.release()
            return first + later, version

    events, created = await scenario()

    assert events[0] == {
        "type": "BOOKMARK",
        "object": {
            "kind": "ResourceSlice",
            "apiVersion": "resource.k8s.io/v1",
            "metadata": {"resourceVersion": since},
        },
    }
    changes = [event for event in events if event["type"] != "BOOKMARK"]
    assert [(event["type"], version_of(event)) for event in changes] == [("ADDED", created)]
    # No bookmark claims a version before its events arrived; the last one passes the node-b slice,
    # which is not in the selection.
    added_at = events.index(changes[0])
    assert all(version_of(event) < created for event in events[:added_at])
    assert version_of(events[-1]) == created + 1


async def test_the_aio_watch_class_reads_the_stream(server: ApiServer, kubeconfig: Path) -> None:
    names = sorted(create(server, slice_body())["metadata"]["name"] for _ in range(2))

    async def scenario() -> list[tuple[str, str]]:
        async with aio_slices(kubeconfig) as slices:
            seen: list[tuple[str, str]] = []
            async with aio_watch.Watch() as stream:
                async for event in stream.stream(slices.list_resource_slice, timeout_seconds=5):
                    seen.append((event["type"], event["object"].metadata.name))
                    if len(seen) == 2:
                        stream.stop()
            return seen

    assert await scenario() == [("ADDED", name) for name in names]


async def test_timeout_seconds_ends_the_stream_cleanly(server: ApiServer, kubeconfig: Path) -> None:
    async def scenario() -> tuple[bytes, float]:
        async with aio_slices(kubeconfig) as slices:
            started = time.monotonic()
            response = await slices.list_resource_slice_without_preload_content(
                watch=True, resource_version=current_version(server), timeout_seconds=1
            )
            line = await response.content.readline()
            response.release()
            return line, time.monotonic() - started

    line, elapsed = await scenario()

    assert line == b""  # no bookmarks asked for, no changes: nothing, then the end
    assert 1 <= elapsed < 3
    assert server.open_watches == 0


async def test_expire_watches_sends_410_and_ends_every_watch(server: ApiServer, kubeconfig: Path) -> None:
    async def scenario() -> tuple[dict[str, Any], bytes]:
        async with aio_slices(kubeconfig) as slices:
            response = await slices.list_resource_slice_without_preload_content(
                watch=True, resource_version=current_version(server)
            )
            assert server.open_watches == 1
            await asyncio.to_thread(server.expire_watches)
            assert server.open_watches == 0
            error, end = await read_events(response, 1), await response.content.readline()
            response.release()
            return error[0], end

    since = current_version(server)
    error, end = await scenario()

    assert error == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since} ({since})",
            "reason": "Expired",
            "code": 410,
        },
    }
    assert end == b""


async def test_drop_watches_cuts_the_connection(server: ApiServer, kubeconfig: Path) -> None:
    create(server, slice_body())
    async with aio_slices(kubeconfig) as slices:
        response = await slices.list_resource_slice_without_preload_content(watch=True)
        assert (await read_events(response, 1))[0]["type"] == "ADDED"
        await asyncio.to_thread(server.drop_watches)
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.content.readline()
        response.release()
    assert server.open_watches == 0


async def test_a_watch_whose_client_leaves_is_no_longer_open(server: ApiServer, kubeconfig: Path) -> None:
    async with aio_slices(kubeconfig) as slices:
        response = await slices.list_resource_slice_without_preload_content(watch=True)
        assert server.open_watches == 1
        response.close()

    wait_until(lambda: server.open_watches == 0, timeout=2)


def test_watches_fail_only_when_fail_methods_names_them(
    server: ApiServer, api_client: client.ApiClient
) -> None:
    slices = client.ResourceV1Api(api_client)
    create(server, slice_body())
    server.faults.fail_next, server.faults.fail_status = 1, 503

    assert [kind for kind, _ in first_events(slices.list_resource_slice, 1)] == ["ADDED"]
    assert server.faults.fail_next == 1  # the watch did not use it up
    server.faults.fail_methods = frozenset({"WATCH"})
    with pytest.raises(client.ApiException) as failed:
        first_events(slices.list_resource_slice, 1)
    assert failed.value.status == 503
    assert slices.list_resource_slice().items
