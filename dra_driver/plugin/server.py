"""The two kubelet-facing gRPC servers and their socket lifecycle.

Order matters: the DRA service is listening before the registration socket appears (kubelet
connects to the endpoint as soon as it registers us). On shutdown the DRA service refuses new
calls and lets in-flight ones finish first: removing the registration socket makes kubelet close
its connection, which would cancel them. Only then do both sockets go.

Besides DRAPlugin, the DRA socket serves the device health stream kubelet watches
(DRAResourceHealth) and the standard gRPC health service for probes.
"""

import asyncio
import contextlib
from pathlib import Path

import grpc
import structlog

from dra_driver._proto.dra.v1 import api_pb2 as dra_v1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2 as dra_v1beta1_pb2
from dra_driver._proto.dra_health.v1 import api_pb2 as health_v1_pb2
from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1_pb2
from dra_driver._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from dra_driver.claims.engine import ClaimEngine
from dra_driver.plugin.dra import add_dra_services
from dra_driver.plugin.grpc_health import GrpcHealthService, add_grpc_health_service
from dra_driver.plugin.health_stream import HealthBroadcaster, add_resource_health_services
from dra_driver.plugin.registration import RegistrationService
from dra_driver.plugin.sockets import (
    DRA_SOCKETS_PATTERN,
    clear_stale_socket,
    hidden_socket_path,
    registration_sockets_pattern,
    remove_dead_sockets,
)

log = structlog.get_logger("dra_driver.plugin")

# Kubelet's pod termination grace defaults to 30 s; leave room to exit after in-flight calls.
SHUTDOWN_GRACE_SECONDS = 20.0

# The fully-qualified names of the services on the DRA socket: what health probes may ask about.
DRA_SOCKET_SERVICES = (
    dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name,
    dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name,
    health_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
    health_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
)


async def _serve_on(socket_path: Path, server: grpc.aio.Server) -> None:
    """The socket appears under its name only once it listens: gRPC binds, then listens, and a
    client that sees the file in between (kubelet's plugin watcher reacts to its creation; the
    benchmarks poll for it) is refused. Bound under a hidden name, which kubelet's watcher
    ignores, and renamed into place, it is never seen half made."""
    clear_stale_socket(socket_path)
    hidden = hidden_socket_path(socket_path)
    hidden.unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{hidden}")
    await server.start()
    hidden.replace(socket_path)


class KubeletPluginServer:
    def __init__(
        self,
        *,
        driver_name: str,
        registration_socket: Path,
        dra_socket: Path,
        engine: ClaimEngine,
        health: HealthBroadcaster | None = None,
    ):
        """`health`: where device health is published for kubelet; None gives an empty device list
        until someone calls `self.health.update()`."""
        self._driver_name = driver_name
        self.registration_socket = registration_socket
        self.dra_socket = dra_socket
        self.health = health if health is not None else HealthBroadcaster()
        self.grpc_health = GrpcHealthService(DRA_SOCKET_SERVICES)
        self.registration = RegistrationService(driver_name, str(dra_socket))
        self._dra_server = grpc.aio.server()
        add_dra_services(self._dra_server, engine)
        add_resource_health_services(self._dra_server, self.health)
        add_grpc_health_service(self._dra_server, self.grpc_health)
        self._registration_server = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(self.registration, self._registration_server)

    async def start(self) -> None:
        for directory, pattern in (
            (self.dra_socket.parent, DRA_SOCKETS_PATTERN),
            (self.registration_socket.parent, registration_sockets_pattern(self._driver_name)),
        ):
            for dead in remove_dead_sockets(directory, pattern):
                log.info("removed a socket no agent serves on any more", path=str(dead))
        await _serve_on(self.dra_socket, self._dra_server)
        try:
            await _serve_on(self.registration_socket, self._registration_server)
        except BaseException:
            await self._dra_server.stop(None)
            self.dra_socket.unlink(missing_ok=True)
            raise
        self.grpc_health.set_serving(True)
        log.info(
            "serving kubelet",
            registration_socket=str(self.registration_socket),
            dra_socket=str(self.dra_socket),
        )

    async def stop(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        # The streaming calls never end on their own and would hold the graceful stop for the
        # whole grace period: they end first, health watchers having been told NOT_SERVING.
        self.grpc_health.set_serving(False)
        self.health.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.grpc_health.close()
        await self._dra_server.stop(grace)
        await self._registration_server.stop(None)
        self.registration_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)
        log.info("stopped serving kubelet; sockets removed")
