"""A socket appears under its name only once it listens (kubelet reacts to the file's creation)."""

import socket
from pathlib import Path

import grpc

from dra_driver.plugin.server import _serve_on
from dra_driver.plugin.sockets import hidden_socket_path


class _RecordingServer:
    """A real gRPC server that notes where it was asked to bind and whether the final name
    existed at that moment."""

    def __init__(self, final: Path) -> None:
        self._server = grpc.aio.server()
        self._final = final
        self.bound: list[str] = []
        self.final_existed_when_bound = False

    def add_insecure_port(self, address: str) -> int:
        self.bound.append(address)
        port = self._server.add_insecure_port(address)
        self.final_existed_when_bound = self._final.exists()
        return port

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float | None) -> None:
        await self._server.stop(grace)


async def test_the_socket_is_bound_hidden_and_renamed_into_place_once_it_listens(tmp_path: Path) -> None:
    final = tmp_path / "gpu.dra-driver.dev-reg.sock"
    leftover = hidden_socket_path(final)
    leftover.write_text("left by an agent killed while binding")

    async def serve() -> _RecordingServer:
        server = _RecordingServer(final)
        await _serve_on(final, server)  # type: ignore[arg-type]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(final))
        finally:
            await server.stop(None)
        return server

    server = await serve()
    assert server.bound == [f"unix://{leftover}"]
    assert leftover.name.startswith(".")  # kubelet's plugin watcher skips dot files
    assert not server.final_existed_when_bound
    assert final.exists() and not leftover.exists()
