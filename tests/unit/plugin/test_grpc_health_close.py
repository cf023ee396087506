"""Closing the gRPC health service waits for its Watch calls to send their last status and end,
so a server stop that follows cannot cut a watcher off before it heard NOT_SERVING."""

import asyncio
from typing import Any, cast

import grpc

from dra_driver.plugin.grpc_health import GrpcHealthService, HealthCheckRequest, HealthCheckResponse

NO_CONTEXT = cast(grpc.aio.ServicerContext[Any, Any], None)  # Watch never uses it


class SlowSender:
    """Stands for gRPC sending each response a little later, as the server does under load."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.sent_one = asyncio.Event()

    async def watch(self, service: GrpcHealthService) -> None:
        async for response in service.Watch(HealthCheckRequest(service=""), context=NO_CONTEXT):
            await asyncio.sleep(0.02)
            self.sent.append(HealthCheckResponse.ServingStatus.Name(response.status))
            self.sent_one.set()


async def test_close_returns_once_every_watch_has_sent_its_last_status_and_ended() -> None:
    service = GrpcHealthService(["v1.DRAPlugin"])
    service.set_serving(True)
    senders = [SlowSender() for _ in range(3)]
    calls = [asyncio.create_task(sender.watch(service)) for sender in senders]
    await asyncio.gather(*(sender.sent_one.wait() for sender in senders))  # each has sent SERVING
    service.set_serving(False)
    await service.close()
    ended = all(call.done() for call in calls)
    assert all(sender.sent == senders[0].sent for sender in senders)
    assert (senders[0].sent, ended) == (["SERVING", "NOT_SERVING"], True)
