"""Device health as kubelet watches it: DRAResourceHealth.NodeWatchResources, v1alpha1 and v1, over
the real DRA unix socket of an in-process plugin server (and once through the agent process)."""

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from dra_driver._proto.dra_health.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from dra_driver._proto.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from dra_driver.health.model import DeviceHealth, HealthStatus, NodeHealth
from dra_driver.plugin.health_stream import HealthBroadcaster
from dra_driver.plugin.server import KubeletPluginServer
from dra_driver.tools import kubelet_client
from tests.support.agent import AgentProcess
from tests.support.engines import simulated_engine

DRIVER = "gpu.dra-driver.dev"
APIS = {"v1alpha1": (v1alpha1_pb2, v1alpha1_grpc), "v1": (v1_pb2, v1_grpc)}
# Generous for a busy CI machine, yet far below every resend interval the tests rely on not hitting.
PROMPTLY = 3.0

NODE_HEALTH = NodeHealth(
    pool="node-a",
    devices={
        "gpu-1": DeviceHealth(
            HealthStatus.UNHEALTHY, since=1_700_000_100.9, message="XID 79: fell off the bus"
        ),
        "gpu-0": DeviceHealth(HealthStatus.HEALTHY, since=1_700_000_000.0),
        "gpu-2": DeviceHealth(HealthStatus.UNKNOWN, since=1_700_000_200.5, message="not checked yet"),
    },
)


def _device(name: str, health: str, since: int, timeout: int, message: str = "") -> dict[str, Any]:
    return {
        "device": {"pool_name": "node-a", "device_name": name},
        "health": health,
        "last_updated_time": str(since),  # int64 in proto3 JSON
        "health_check_timeout_seconds": str(timeout),
        "message": message,
    }


class NoClaims:
    async def get(self, namespace: str, name: str) -> object:
        raise AssertionError("the health tests prepare nothing")


def build_server(root: Path, health: HealthBroadcaster | None = None) -> KubeletPluginServer:
    engine = simulated_engine(root, NoClaims())
    return KubeletPluginServer(
        driver_name=DRIVER,
        registration_socket=root / "registry" / f"{DRIVER}-reg.sock",
        dra_socket=root / "plugins" / DRIVER / "dra.sock",
        engine=engine,
        health=health,
    )


@asynccontextmanager
async def plugin_server(
    root: Path, health: HealthBroadcaster | None = None
) -> AsyncIterator[KubeletPluginServer]:
    server = build_server(root, health)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def watch(dra_socket: Path, api: str) -> AsyncIterator[Any]:
    """An open NodeWatchResources call, as kubelet keeps one."""
    pb2, grpc_module = APIS[api]
    async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
        call = grpc_module.DRAResourceHealthStub(channel).NodeWatchResources(pb2.NodeWatchResourcesRequest())
        try:
            yield call
        finally:
            call.cancel()


async def next_list(call: Any, within: float = PROMPTLY) -> list[dict[str, Any]]:
    response = await asyncio.wait_for(call.read(), within)
    assert response is not grpc.aio.EOF, "the stream ended"
    answer = MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    devices: list[dict[str, Any]] = answer["devices"]
    return devices


@pytest.mark.parametrize("api", APIS)
async def test_the_complete_list_arrives_at_once(short_dir: Path, api: str) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with (
            plugin_server(short_dir, HealthBroadcaster(NODE_HEALTH)) as server,
            watch(server.dra_socket, api) as call,
        ):
            return await next_list(call)

    # Default resend every 10 s, so each device carries a 30 s timeout, kubelet's own default.
    assert await scenario() == [
        _device("gpu-0", "HEALTHY", 1_700_000_000, 30),
        _device("gpu-1", "UNHEALTHY", 1_700_000_100, 30, "XID 79: fell off the bus"),
        _device("gpu-2", "UNKNOWN", 1_700_000_200, 30, "not checked yet"),
    ]


async def test_without_a_broadcaster_the_list_is_empty(short_dir: Path) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with plugin_server(short_dir) as server, watch(server.dra_socket, "v1") as call:
            assert server.health.node_health == NodeHealth(pool="")
            return await next_list(call)

    assert await scenario() == []


async def test_an_update_reaches_every_open_stream_promptly(short_dir: Path) -> None:
    # A resend interval far beyond the test: whatever arrives after the first list is the update.
    health = HealthBroadcaster(NODE_HEALTH, resend_seconds=600)
    failed = DeviceHealth(HealthStatus.UNHEALTHY, since=1_700_000_300, message="XID 48: double-bit ECC")
    updated = NodeHealth(pool="node-a", devices={**NODE_HEALTH.devices, "gpu-0": failed})

    async def scenario() -> list[list[dict[str, Any]]]:
        async with (
            plugin_server(short_dir, health) as server,
            watch(server.dra_socket, "v1alpha1") as alpha,
            watch(server.dra_socket, "v1") as v1,
        ):
            await next_list(alpha)
            await next_list(v1)
            health.update(updated)
            return [await next_list(alpha), await next_list(v1)]

    for devices in await scenario():
        # Still the complete list: the unchanged devices come along with the changed one.
        assert [d["device"]["device_name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2"]
        assert devices[0] == _device("gpu-0", "UNHEALTHY", 1_700_000_300, 1800, "XID 48: double-bit ECC")


@pytest.mark.parametrize("api", APIS)
async def test_the_list_is_resent_within_the_interval_without_a_change(short_dir: Path, api: str) -> None:
    resend = 0.4
    health = HealthBroadcaster(NODE_HEALTH, resend_seconds=resend)

    async with plugin_server(short_dir, health) as server, watch(server.dra_socket, api) as call:
        lists = [await next_list(call)]
        arrivals = [time.monotonic()]
        for _ in range(3):
            lists.append(await next_list(call, within=resend + PROMPTLY))
            arrivals.append(time.monotonic())
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]

    assert all(devices == lists[0] for devices in lists)
    assert len(lists[0]) == 3
    assert lists[0][0]["health_check_timeout_seconds"] == "2"  # ceil(3 * 0.4)
    # A heartbeat, not a flood: about one list per interval.
    assert all(resend * 0.75 <= gap <= resend + 1.0 for gap in gaps), gaps


async def test_messages_are_cut_to_1024_characters(short_dir: Path) -> None:
    # Multi-byte characters: a cut by bytes would either break one or keep fewer characters.
    long = "€" * 1500
    # A lone surrogate (from text decoded with surrogateescape) cannot be UTF-8 encoded at all.
    odd = "\udcff bad byte"
    health = HealthBroadcaster(
        NodeHealth(
            pool="node-a",
            devices={
                "gpu-0": DeviceHealth(HealthStatus.UNHEALTHY, since=1, message=long),
                "gpu-1": DeviceHealth(HealthStatus.UNHEALTHY, since=1, message=odd),
                "gpu-2": DeviceHealth(HealthStatus.UNHEALTHY, since=1, message="€" * 1024),
            },
        )
    )

    async def scenario() -> list[dict[str, Any]]:
        async with plugin_server(short_dir, health) as server, watch(server.dra_socket, "v1") as call:
            return await next_list(call)

    messages = [device["message"] for device in await scenario()]

    assert messages == ["€" * 1024, "? bad byte", "€" * 1024]


async def test_a_cancelled_stream_ends_without_leaving_tasks_behind(short_dir: Path) -> None:
    health = HealthBroadcaster(NODE_HEALTH, resend_seconds=600)

    async with (
        plugin_server(short_dir, health) as server,
        grpc.aio.insecure_channel(f"unix://{server.dra_socket}") as channel,
    ):
        await channel.channel_ready()
        # Counted, not compared: gRPC replaces its task waiting for the next call with a new one.
        idle = len(asyncio.all_tasks())
        stub = v1_grpc.DRAResourceHealthStub(channel)
        call = stub.NodeWatchResources(v1_pb2.NodeWatchResourcesRequest())
        await next_list(call)
        streaming = len(asyncio.all_tasks())
        call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED
        for _ in range(int(PROMPTLY / 0.01)):  # the server learns of the cancel asynchronously
            if len(asyncio.all_tasks()) <= idle:
                break
            await asyncio.sleep(0.01)
        after = len(asyncio.all_tasks())
        # The server still streams to a new caller afterwards.
        again = stub.NodeWatchResources(v1_pb2.NodeWatchResourcesRequest())
        devices = await next_list(again)
        again.cancel()

    assert streaming > idle, "the open stream runs as server tasks"
    assert after == idle
    assert len(devices) == 3


async def test_stopping_the_server_ends_open_streams_at_once(short_dir: Path) -> None:
    async with (
        plugin_server(short_dir, HealthBroadcaster(NODE_HEALTH)) as server,
        watch(server.dra_socket, "v1") as v1,
        watch(server.dra_socket, "v1alpha1") as alpha,
    ):
        await next_list(v1)
        await next_list(alpha)
        started = time.monotonic()
        # The default grace is 20 s: an open stream must not hold the stop that long.
        await server.stop()
        took = time.monotonic() - started
        endings = []
        for call in (v1, alpha):
            # The list current at the stop, then the end of the call.
            last = await next_list(call)
            endings.append((len(last), await call.read(), await call.code()))

    assert took < PROMPTLY
    assert endings == [(3, grpc.aio.EOF, grpc.StatusCode.OK)] * 2


async def test_registration_lists_the_health_services_after_the_dra_plugin_versions(short_dir: Path) -> None:
    async with plugin_server(short_dir) as server:
        result = await kubelet_client.register(server.registration_socket)

    assert result["pluginInfo"]["supported_versions"] == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert result["selectedService"] == "v1.DRAPlugin"
    assert result["registered"] is True


@pytest.mark.parametrize("api", APIS)
async def test_the_agent_serves_the_health_stream_on_its_dra_socket(agent: AgentProcess, api: str) -> None:
    async with watch(agent.dirs.dra_socket, api) as call:
        devices = await next_list(call)

    # Whatever the agent knows of its devices: each entry is a device of its own pool.
    assert all(device["device"]["pool_name"] == "node-a" for device in devices), devices
