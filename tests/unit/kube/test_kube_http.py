"""dra_driver.kube.kube_http: the keep-alive GET of the pod-startup path, against the stand-in API
server (the real REST protocol, served by aiohttp) and against a raw socket server that answers
exactly the bytes a test scripts, well-formed or not."""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from kubernetes import client

from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.source import ApiServerClaimSource
from dra_driver.kube.kube_api import Configuration, KubeClient
from dra_driver.kube.kube_http import MAX_BODY_BYTES, HttpProtocolError, KeepAliveClient
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate

# What a scripted server sends for one request: the bytes, then whether it closes the connection.
Script = Callable[[int, bytes], tuple[bytes, bool]]


@dataclass
class RawServer:
    port: int
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0


@asynccontextmanager
async def raw_server(script: Script, hold_seconds: float = 0.0) -> AsyncIterator[RawServer]:
    """Answers request number n (counted over all connections) with script(n, request)."""
    state = RawServer(port=0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        try:
            while True:
                try:
                    request = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                state.requests.append(request)
                await asyncio.sleep(hold_seconds)
                answer, close = script(len(state.requests) - 1, request)
                writer.write(answer)
                await writer.drain()
                if close:
                    return
        finally:
            state.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    async with server:
        yield state


def answer(body: bytes = b'{"ok":true}', status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def always(data: bytes, close: bool = False) -> Script:
    return lambda _n, _request: (data, close)


async def get_from(server: RawServer, path: str = "/x") -> tuple[int, bytes]:
    pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
    try:
        got = await pool.get(path, {"Accept": "application/json"}, 5)
        return got.status, got.body
    finally:
        await pool.close()


def test_the_claim_comes_back_as_the_official_client_reads_it() -> None:
    """Same status and same object as the REST layer's answer, for a claim that is there and one
    that is not, from the stand-in API server."""
    server = ApiServer().start()
    try:
        api_client = client.ApiClient(client.Configuration(host=server.url))
        allocate(client.ResourceV1Api(api_client), "c1", {"gpu": "gpu-0"}, pool="node-a")
        api_client.close()

        async def both_ways() -> list[object]:
            found = []
            for lean in (True, False):
                kube = KubeClient(Configuration(host=server.url))
                if not lean:
                    await kube.keep_alive.close()  # type: ignore[union-attr]
                    kube.keep_alive = None
                source = ApiServerClaimSource(kube)
                try:
                    found.append(await source.get("default", "c1"))
                    try:
                        await source.get("default", "gone")
                    except ClaimRejected as error:
                        found.append(str(error))
                finally:
                    await kube.close()
            return found

        lean_claim, lean_missing, official_claim, official_missing = asyncio.run(both_ways())
    finally:
        server.stop()
    assert lean_claim == official_claim
    assert json.dumps(lean_claim)  # a whole object
    assert lean_claim["metadata"]["name"] == "c1"  # type: ignore[index]
    assert lean_missing == official_missing and "not found" in lean_missing  # type: ignore[operator]


def test_the_request_carries_the_headers_host_and_server_path_prefix() -> None:
    async def scenario() -> bytes:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}/k8s/clusters/c-1/", ssl_context=None)
            await pool.get("/api/v1/x%2Fy", {"Accept": "application/json", "Authorization": "Bearer t"}, 5)
            await pool.close()
            return server.requests[0]

    request = asyncio.run(scenario())
    lines = request.decode().split("\r\n")
    assert lines[0] == "GET /k8s/clusters/c-1/api/v1/x%2Fy HTTP/1.1"
    assert lines[1].startswith("Host: 127.0.0.1:")
    assert lines[2:4] == ["Accept: application/json", "Authorization: Bearer t"]


def test_one_connection_serves_call_after_call() -> None:
    async def scenario() -> tuple[int, int, list[int]]:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            statuses = [(await pool.get("/x", {}, 5)).status for _ in range(5)]
            await pool.close()
            return server.connections, pool.connections_opened, statuses

    assert asyncio.run(scenario()) == (1, 1, [200] * 5)


def test_concurrent_calls_open_no_more_connections_than_allowed() -> None:
    async def scenario() -> tuple[int, list[int]]:
        async with raw_server(always(answer()), hold_seconds=0.05) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None, max_connections=2)
            answers = await asyncio.gather(*(pool.get("/x", {}, 5) for _ in range(6)))
            await pool.close()
            return server.most_open, [got.status for got in answers]

    most_open, statuses = asyncio.run(scenario())
    assert most_open == 2 and statuses == [200] * 6


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    """Keep-alive timeouts: the server hangs up after each answer without saying so."""

    def hang_up(_n: int, _request: bytes) -> tuple[bytes, bool]:
        return answer(), True

    async def scenario() -> tuple[list[int], int]:
        async with raw_server(hang_up) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            statuses = []
            for _ in range(3):
                statuses.append((await pool.get("/x", {}, 5)).status)
                await asyncio.sleep(0.05)  # the FIN arrives while the connection is idle
            await pool.close()
            return statuses, server.connections

    assert asyncio.run(scenario()) == ([200] * 3, 3)


def test_a_reused_connection_that_fails_mid_request_is_retried_on_a_new_one() -> None:
    """The server drops the connection on the second request without answering: a GET is
    idempotent, so the pool asks again on a fresh connection."""

    def drop_second(n: int, _request: bytes) -> tuple[bytes, bool]:
        return (b"", True) if n == 1 else (answer(), False)

    async def scenario() -> tuple[list[int], int]:
        async with raw_server(drop_second) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            statuses = [(await pool.get("/x", {}, 5)).status for _ in range(2)]
            await pool.close()
            return statuses, server.connections

    assert asyncio.run(scenario()) == ([200, 200], 2)


def test_connection_close_is_honoured() -> None:
    async def scenario() -> int:
        async with raw_server(always(answer(extra="Connection: close\r\n"))) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            for _ in range(3):
                await pool.get("/x", {}, 5)
            await pool.close()
            return pool.connections_opened

    assert asyncio.run(scenario()) == 3


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;name=value\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\n"
)
UNTIL_CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it"
INTERIM_FIRST = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + answer(b"then this")


@pytest.mark.parametrize(
    ("wire", "close", "body"),
    [
        (CHUNKED, False, b"hello, world"),
        (UNTIL_CLOSE, True, b"all of it"),
        (INTERIM_FIRST, False, b"then this"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False, b""),
        (answer(b"{}", "404 Not Found"), False, b"{}"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", True, b"ok"),
    ],
    ids=["chunked", "until-close", "interim-answer-first", "no-content", "not-found", "http-1.0"],
)
def test_each_way_http_frames_a_body(wire: bytes, close: bool, body: bytes) -> None:
    async def scenario() -> tuple[int, bytes]:
        async with raw_server(always(wire, close)) as server:
            return await get_from(server)

    status, got = asyncio.run(scenario())
    assert got == body
    assert status == int(wire.rsplit(b"HTTP/1.", 1)[1][2:5])


@pytest.mark.parametrize(
    ("wire", "named"),
    [
        (b"HTTP/2 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(), "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX", "chunk"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx", "Content-Encoding"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"1\r\nx\r\n0\r\n\r\n",
            "Content-Encoding",
        ),
    ],
    ids=[
        "version",
        "status-code",
        "header",
        "negative-length",
        "huge-length",
        "transfer-encoding",
        "chunk-size",
        "chunk-end",
        "compressed",
        "compressed-chunked",
    ],
)
def test_an_answer_that_is_not_http_is_an_error_naming_the_part(wire: bytes, named: str) -> None:
    async def scenario() -> str:
        async with raw_server(always(wire)) as server:
            with pytest.raises(HttpProtocolError) as raised:
                await get_from(server)
            return str(raised.value)

    message = asyncio.run(scenario())
    assert message.startswith(named), message


def test_a_broken_answer_closes_its_connection_and_the_next_call_gets_a_new_one() -> None:
    def broken_first(n: int, _request: bytes) -> tuple[bytes, bool]:
        return (b"HTTP/1.1 abc\r\n\r\n", False) if n == 0 else (answer(), False)

    async def scenario() -> tuple[int, int]:
        async with raw_server(broken_first) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            with pytest.raises(HttpProtocolError):
                await pool.get("/x", {}, 5)
            status = (await pool.get("/x", {}, 5)).status
            await pool.close()
            return status, server.connections

    assert asyncio.run(scenario()) == (200, 2)


def test_an_answer_cut_short_is_a_connection_error() -> None:
    async def scenario() -> None:
        async with raw_server(always(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True)) as server:
            await get_from(server)

    with pytest.raises(ConnectionResetError, match="mid-answer"):
        asyncio.run(scenario())


def test_no_answer_in_time_is_a_timeout_and_the_connection_is_not_kept() -> None:
    async def scenario() -> int:
        async with raw_server(always(answer()), hold_seconds=1.0) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            with pytest.raises(TimeoutError):
                await pool.get("/x", {}, 0.1)
            idle = len(pool._idle)
            await pool.close()
            return idle

    assert asyncio.run(scenario()) == 0


def test_a_header_value_with_a_line_break_is_refused_before_sending() -> None:
    async def scenario() -> int:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            with pytest.raises(ValueError, match="Authorization"):
                await pool.get("/x", {"Authorization": "Bearer a\r\nX-Evil: 1"}, 5)
            await pool.close()
            return len(server.requests)

    assert asyncio.run(scenario()) == 0


@pytest.mark.parametrize("server", ["ftp://host", "https://", "host:443"])
def test_a_server_url_that_is_not_http_is_refused(server: str) -> None:
    with pytest.raises(ValueError, match="server"):
        KeepAliveClient(server, ssl_context=None)


def test_a_configured_proxy_keeps_claim_gets_on_the_official_client() -> None:
    """The lean pool connects directly; through a proxy the REST layer's aiohttp path is used."""
    assert KubeClient(Configuration(host="https://10.0.0.1:6443")).keep_alive is not None
    proxied = Configuration(host="https://10.0.0.1:6443")
    proxied.proxy = "http://proxy.example:3128"
    assert KubeClient(proxied).keep_alive is None


def test_a_connection_opened_ahead_serves_the_first_get() -> None:
    """Opened while the agent starts, so kubelet's first prepare does not wait for the handshakes."""

    async def scenario() -> tuple[int, int, int, int]:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            await pool.open_ahead(5)
            opened_ahead = pool.connections_opened
            status = (await pool.get("/x", {}, 5)).status
            await pool.close()
            return opened_ahead, pool.connections_opened, server.connections, status

    assert asyncio.run(scenario()) == (1, 1, 1, 200)


def test_a_connection_that_cannot_be_opened_ahead_is_left_to_the_first_get() -> None:
    async def scenario() -> int:
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens there now
        pool = KeepAliveClient(f"http://127.0.0.1:{port}", ssl_context=None)
        await pool.open_ahead(5)
        await pool.close()
        return pool.connections_opened

    assert asyncio.run(scenario()) == 0
