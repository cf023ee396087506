"""The two kubelet-facing gRPC servers and their socket lifecycle.

Order matters: the DRA service is listening before the registration socket appears (kubelet
connects to the endpoint as soon as it registers us). On shutdown the DRA service refuses new
calls and lets in-flight ones finish first: removing the registration socket makes kubelet close
its connection, which would cancel them. Only then do both sockets go.
"""

from pathlib import Path

import grpc
import structlog

from dra_driver._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from dra_driver.claims.engine import ClaimEngine
from dra_driver.plugin.dra import add_dra_services
from dra_driver.plugin.registration import RegistrationService
from dra_driver.plugin.sockets import clear_stale_socket

log = structlog.get_logger("dra_driver.plugin")

# Kubelet's pod termination grace defaults to 30 s; leave room to exit after in-flight calls.
SHUTDOWN_GRACE_SECONDS = 20.0


async def _serve_on(socket_path: Path, server: grpc.aio.Server) -> None:
    clear_stale_socket(socket_path)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()


class KubeletPluginServer:
    def __init__(self, *, driver_name: str, registration_socket: Path, dra_socket: Path, engine: ClaimEngine):
        self.registration_socket = registration_socket
        self.dra_socket = dra_socket
        self.registration = RegistrationService(driver_name, str(dra_socket))
        self._dra_server = grpc.aio.server()
        add_dra_services(self._dra_server, engine)
        self._registration_server = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(self.registration, self._registration_server)

    async def start(self) -> None:
        await _serve_on(self.dra_socket, self._dra_server)
        try:
            await _serve_on(self.registration_socket, self._registration_server)
        except BaseException:
            await self._dra_server.stop(None)
            self.dra_socket.unlink(missing_ok=True)
            raise
        log.info(
            "serving kubelet",
            registration_socket=str(self.registration_socket),
            dra_socket=str(self.dra_socket),
        )

    async def stop(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        await self._dra_server.stop(grace)
        await self._registration_server.stop(None)
        self.registration_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)
        log.info("stopped serving kubelet; sockets removed")
