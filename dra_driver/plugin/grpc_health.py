"""The standard gRPC health service (grpc.health.v1.Health) on the DRA socket.

Liveness and readiness probes (grpc_health_probe and the like) can then ask the socket kubelet
uses whether the plugin serves, instead of only whether the process runs. Per the protocol,
"" stands for the whole server and other names are fully-qualified gRPC service names.
"""

import asyncio
from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from typing import Any

import grpc

from dra_driver._proto.grpc_health.v1 import health_pb2
from dra_driver.plugin.health_stream import LatestValue

HealthCheckRequest = health_pb2.HealthCheckRequest
HealthCheckResponse = health_pb2.HealthCheckResponse
ServingStatus = HealthCheckResponse.ServingStatus

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class GrpcHealthService:
    """NOT_SERVING until `set_serving(True)`; the same status for the server and every service it
    names, as they start and stop together."""

    def __init__(self, services: Iterable[str]) -> None:
        self._known = frozenset(("", *services))
        self._serving = LatestValue(False)
        # The tasks of open Watch calls, each of which gRPC runs to the call's end.
        self._watches: set[asyncio.Task[Any]] = set()

    def set_serving(self, serving: bool) -> None:
        self._serving.set(serving)

    async def close(self) -> None:
        """Ends every Watch call, after it has sent the current status, and waits for them to
        end: they would otherwise hold a graceful server stop for its whole grace period, and a
        call still sending its last status when the stop begins could lose it."""
        self._serving.close()
        if self._watches:
            await asyncio.wait(set(self._watches))

    def status(self, service: str) -> ServingStatus:
        if service not in self._known:
            return HealthCheckResponse.SERVICE_UNKNOWN
        return HealthCheckResponse.SERVING if self._serving.value else HealthCheckResponse.NOT_SERVING

    async def Check(
        self, request: HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> HealthCheckResponse:
        if request.service not in self._known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return HealthCheckResponse(status=self.status(request.service))

    async def Watch(
        self, request: HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncGenerator[HealthCheckResponse, None]:
        """The current status, then each change. An unknown service gets SERVICE_UNKNOWN and the
        call stays open, as the protocol asks (a service may be added later)."""
        sent = None
        call = asyncio.current_task()
        if call is not None:
            self._watches.add(call)
        try:
            async with aclosing(self._serving.follow()) as changes:
                async for _ in changes:
                    status = self.status(request.service)
                    if status != sent:
                        yield HealthCheckResponse(status=status)
                        sent = status
        finally:
            if call is not None:
                self._watches.discard(call)


def add_grpc_health_service(server: grpc.aio.Server, service: GrpcHealthService) -> None:
    """Registered by hand: the generated registration helper is untyped."""
    handlers = {
        "Check": grpc.unary_unary_rpc_method_handler(
            service.Check,
            request_deserializer=HealthCheckRequest.FromString,
            response_serializer=HealthCheckResponse.SerializeToString,
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            service.Watch,
            request_deserializer=HealthCheckRequest.FromString,
            response_serializer=HealthCheckResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(HEALTH_SERVICE_NAME, handlers),))
