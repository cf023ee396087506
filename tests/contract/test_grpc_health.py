"""The standard gRPC health service on the DRA socket, called by its wire paths as a probe such as
grpc_health_probe does, against an in-process plugin server and once against the agent process."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver._proto.grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from tests.contract.test_health_stream import build_server, plugin_server
from tests.support.agent import AgentProcess

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
PROMPTLY = 3.0

DRA_SERVICES = [
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
]


@asynccontextmanager
async def health_channel(dra_socket: Path) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
        yield channel


async def check(channel: grpc.aio.Channel, service: str) -> str:
    """The status name, or the gRPC error code's name."""
    call = channel.unary_unary(
        CHECK,
        request_serializer=HealthCheckRequest.SerializeToString,
        response_deserializer=HealthCheckResponse.FromString,
    )
    try:
        response = await call(HealthCheckRequest(service=service), timeout=PROMPTLY)
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return HealthCheckResponse.ServingStatus.Name(response.status)


def watch(channel: grpc.aio.Channel, service: str) -> Any:
    method = channel.unary_stream(
        WATCH,
        request_serializer=HealthCheckRequest.SerializeToString,
        response_deserializer=HealthCheckResponse.FromString,
    )
    return method(HealthCheckRequest(service=service))


async def next_status(call: Any) -> str:
    response = await asyncio.wait_for(call.read(), PROMPTLY)
    return "EOF" if response is grpc.aio.EOF else HealthCheckResponse.ServingStatus.Name(response.status)


async def test_check_answers_serving_for_the_server_and_each_dra_service(short_dir: Path) -> None:
    async def scenario() -> dict[str, str]:
        async with plugin_server(short_dir) as server, health_channel(server.dra_socket) as channel:
            return {service: await check(channel, service) for service in ["", *DRA_SERVICES]}

    assert await scenario() == dict.fromkeys(["", *DRA_SERVICES], "SERVING")


@pytest.mark.parametrize("service", ["v1.DRAPlugin", "grpc.health.v1.Health", "no.such.Service"])
async def test_check_answers_not_found_for_an_unknown_service(short_dir: Path, service: str) -> None:
    async def scenario() -> str:
        async with plugin_server(short_dir) as server, health_channel(server.dra_socket) as channel:
            return await check(channel, service)

    assert await scenario() == "NOT_FOUND"


async def test_not_serving_until_the_server_has_started(short_dir: Path) -> None:
    async def scenario() -> tuple[str, str]:
        server = build_server(short_dir)
        # No socket listens before start(), so the status is read where the servicer keeps it.
        before = HealthCheckResponse.ServingStatus.Name(server.grpc_health.status(""))
        await server.start()
        try:
            async with health_channel(server.dra_socket) as channel:
                return before, await check(channel, "")
        finally:
            await server.stop()

    assert await scenario() == ("NOT_SERVING", "SERVING")


@pytest.mark.parametrize("service", ["", "v1.DRAResourceHealth"])
async def test_watch_turns_not_serving_when_the_server_stops(short_dir: Path, service: str) -> None:
    async with plugin_server(short_dir) as server, health_channel(server.dra_socket) as channel:
        call = watch(channel, service)
        seen = [await next_status(call)]
        stopping = asyncio.create_task(server.stop())
        seen += [await next_status(call), await next_status(call)]
        await stopping
        code = await call.code()

    # The change arrives before the call ends, and ending it does not wait for the stop's grace.
    assert seen == ["SERVING", "NOT_SERVING", "EOF"]
    assert code == grpc.StatusCode.OK


async def test_watch_of_an_unknown_service_says_so_and_stays_open(short_dir: Path) -> None:
    async def scenario() -> tuple[str, bool]:
        async with plugin_server(short_dir) as server, health_channel(server.dra_socket) as channel:
            call = watch(channel, "no.such.Service")
            first = await next_status(call)
            await asyncio.sleep(0.5)
            still_open = not call.done()
            call.cancel()
            return first, still_open

    assert await scenario() == ("SERVICE_UNKNOWN", True)


async def test_the_agent_answers_a_probe_on_its_dra_socket(agent: AgentProcess) -> None:
    async def scenario() -> str:
        async with health_channel(agent.dirs.dra_socket) as channel:
            return await check(channel, "")

    assert await scenario() == "SERVING"
