"""dra_driver.kube.kube_http and the HTTP/1.1 it reads (kube.http_wire): the agent's keep-alive
requests and watch streams, against the stand-in API server (the real REST protocol, served by
aiohttp) and against a raw socket server that answers exactly the bytes a test scripts,
well-formed or not, or plays a proxy."""

import asyncio
import json
import re
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from kubernetes import client

from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.source import ApiServerClaimSource
from dra_driver.kube.http_wire import MAX_BODY_BYTES, MAX_LINE_BYTES, HttpProtocolError
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.kube_http import HttpStream, KeepAliveClient
from dra_driver.kube.server_access import ServerAccess
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
async def raw_server(
    script: Script, hold_seconds: float = 0.0, *, reset: bool = False
) -> AsyncIterator[RawServer]:
    """Answers request number n (counted over all connections) with script(n, request). `reset`:
    a connection the server ends is reset (RST, as a crashed server's is) rather than hung up."""
    state = RawServer(port=0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        try:
            while True:
                try:
                    request = await reader.readuntil(b"\r\n\r\n")
                    length = re.search(rb"\r\nContent-Length: (\d+)\r\n", request)
                    if length:
                        request += await reader.readexactly(int(length[1]))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                state.requests.append(request)
                await asyncio.sleep(hold_seconds)
                answer, close = script(len(state.requests) - 1, request)
                writer.write(answer)
                await writer.drain()
                if close:
                    if reset:  # a zero linger time makes the close an RST, not a FIN
                        linger = struct.pack("ii", 1, 0)
                        writer.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, linger
                        )
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
        got = await pool.request("GET", path, {"Accept": "application/json"}, 5)
        return got.status, got.body
    finally:
        await pool.close()


async def test_the_claim_comes_back_as_the_official_client_reads_it() -> None:
    """The same object the official client reads, for a claim that is there; "not found" for one
    that is not, from the stand-in API server."""
    server = ApiServer().start()
    try:
        api_client = client.ApiClient(client.Configuration(host=server.url))
        resources = client.ResourceV1Api(api_client)
        allocate(resources, "c1", {"gpu": "gpu-0"}, pool="node-a")
        official = json.loads(
            resources.read_namespaced_resource_claim("c1", "default", _preload_content=False).data
        )
        api_client.close()

        async def ours() -> tuple[object, str]:
            kube = KubeClient(ServerAccess(server.url))
            source = ApiServerClaimSource(kube)
            try:
                found = await source.get("default", "c1")
                with pytest.raises(ClaimRejected) as missing:
                    await source.get("default", "gone")
            finally:
                await kube.close()
            return found, str(missing.value)

        claim, missing = await ours()
    finally:
        server.stop()
    assert claim == official
    assert official["metadata"]["name"] == "c1"
    assert "not found" in missing


async def test_the_request_carries_the_headers_host_and_server_path_prefix() -> None:
    async def scenario() -> bytes:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}/k8s/clusters/c-1/", ssl_context=None)
            await pool.request(
                "GET", "/api/v1/x%2Fy", {"Accept": "application/json", "Authorization": "Bearer t"}, 5
            )
            await pool.close()
            return server.requests[0]

    request = await scenario()
    lines = request.decode().split("\r\n")
    assert lines[0] == "GET /k8s/clusters/c-1/api/v1/x%2Fy HTTP/1.1"
    assert lines[1].startswith("Host: 127.0.0.1:")
    assert lines[2:4] == ["Accept: application/json", "Authorization: Bearer t"]


async def test_one_connection_serves_call_after_call() -> None:
    async def scenario() -> tuple[int, int, list[int]]:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            statuses = [(await pool.request("GET", "/x", {}, 5)).status for _ in range(5)]
            await pool.close()
            return server.connections, pool.connections_opened, statuses

    assert await scenario() == (1, 1, [200] * 5)


async def test_concurrent_calls_open_no_more_connections_than_allowed() -> None:
    async def scenario() -> tuple[int, list[int]]:
        async with raw_server(always(answer()), hold_seconds=0.05) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None, max_connections=2)
            answers = await asyncio.gather(*(pool.request("GET", "/x", {}, 5) for _ in range(6)))
            await pool.close()
            return server.most_open, [got.status for got in answers]

    most_open, statuses = await scenario()
    assert most_open == 2 and statuses == [200] * 6


@pytest.mark.parametrize("reset", [False, True], ids=["hung-up", "reset"])
async def test_a_connection_the_server_ended_while_idle_is_replaced(reset: bool) -> None:
    """Keep-alive timeouts: the server hangs up after each answer without saying so; or it resets
    the connection (RST), as an API server that crashed or lost the connection leaves it."""

    def end_after_answer(_n: int, _request: bytes) -> tuple[bytes, bool]:
        return answer(), True

    async def scenario() -> tuple[list[int], int]:
        async with raw_server(end_after_answer, reset=reset) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            statuses = []
            for _ in range(3):
                statuses.append((await pool.request("GET", "/x", {}, 5)).status)
                await asyncio.sleep(0.05)  # the FIN or RST arrives while the connection is idle
            await pool.close()
            return statuses, server.connections

    assert await scenario() == ([200] * 3, 3)


async def test_a_reused_connection_that_fails_mid_request_is_retried_on_a_new_one() -> None:
    """The server drops the connection on the second request without answering: a GET is
    idempotent, so the pool asks again on a fresh connection."""

    def drop_second(n: int, _request: bytes) -> tuple[bytes, bool]:
        return (b"", True) if n == 1 else (answer(), False)

    async def scenario() -> tuple[list[int], int]:
        async with raw_server(drop_second) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            statuses = [(await pool.request("GET", "/x", {}, 5)).status for _ in range(2)]
            await pool.close()
            return statuses, server.connections

    assert await scenario() == ([200, 200], 2)


async def test_connection_close_is_honoured() -> None:
    async def scenario() -> int:
        async with raw_server(always(answer(extra="Connection: close\r\n"))) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            for _ in range(3):
                await pool.request("GET", "/x", {}, 5)
            await pool.close()
            return pool.connections_opened

    assert await scenario() == 3


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
async def test_each_way_http_frames_a_body(wire: bytes, close: bool, body: bytes) -> None:
    async def scenario() -> tuple[int, bytes]:
        async with raw_server(always(wire, close)) as server:
            return await get_from(server)

    status, got = await scenario()
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
async def test_an_answer_that_is_not_http_is_an_error_naming_the_part(wire: bytes, named: str) -> None:
    async def scenario() -> str:
        async with raw_server(always(wire)) as server:
            with pytest.raises(HttpProtocolError) as raised:
                await get_from(server)
            return str(raised.value)

    message = await scenario()
    assert message.startswith(named), message


async def test_a_broken_answer_closes_its_connection_and_the_next_call_gets_a_new_one() -> None:
    def broken_first(n: int, _request: bytes) -> tuple[bytes, bool]:
        return (b"HTTP/1.1 abc\r\n\r\n", False) if n == 0 else (answer(), False)

    async def scenario() -> tuple[int, int]:
        async with raw_server(broken_first) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            with pytest.raises(HttpProtocolError):
                await pool.request("GET", "/x", {}, 5)
            status = (await pool.request("GET", "/x", {}, 5)).status
            await pool.close()
            return status, server.connections

    assert await scenario() == (200, 2)


async def test_an_answer_cut_short_is_a_connection_error() -> None:
    async def scenario() -> None:
        async with raw_server(always(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True)) as server:
            await get_from(server)

    with pytest.raises(ConnectionResetError, match="mid-answer"):
        await scenario()


async def test_no_answer_in_time_is_a_timeout_and_the_connection_is_not_kept() -> None:
    async def scenario() -> int:
        async with raw_server(always(answer()), hold_seconds=1.0) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            with pytest.raises(TimeoutError):
                await pool.request("GET", "/x", {}, 0.1)
            idle = len(pool._idle)
            await pool.close()
            return idle

    assert await scenario() == 0


async def test_a_header_value_with_a_line_break_is_refused_before_sending() -> None:
    async def scenario() -> int:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            with pytest.raises(ValueError, match="Authorization"):
                await pool.request("GET", "/x", {"Authorization": "Bearer a\r\nX-Evil: 1"}, 5)
            await pool.close()
            return len(server.requests)

    assert await scenario() == 0


@pytest.mark.parametrize("server", ["ftp://host", "https://", "host:443"])
def test_a_server_url_that_is_not_http_is_refused(server: str) -> None:
    with pytest.raises(ValueError, match="server"):
        KeepAliveClient(server, ssl_context=None)


async def test_a_connection_opened_ahead_serves_the_first_get() -> None:
    """Opened while the agent starts, so kubelet's first prepare does not wait for the handshakes."""

    async def scenario() -> tuple[int, int, int, int]:
        async with raw_server(always(answer())) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            await pool.open_ahead(5)
            opened_ahead = pool.connections_opened
            status = (await pool.request("GET", "/x", {}, 5)).status
            await pool.close()
            return opened_ahead, pool.connections_opened, server.connections, status

    assert await scenario() == (1, 1, 1, 200)


async def test_a_connection_that_cannot_be_opened_ahead_is_left_to_the_first_get() -> None:
    async def scenario() -> int:
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens there now
        pool = KeepAliveClient(f"http://127.0.0.1:{port}", ssl_context=None)
        await pool.open_ahead(5)
        await pool.close()
        return pool.connections_opened

    assert await scenario() == 0


async def test_a_request_body_is_sent_with_its_length() -> None:
    async def scenario() -> bytes:
        async with raw_server(always(answer(status="201 Created"))) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            got = await pool.request(
                "POST", "/x?dryRun=All", {"Content-Type": "application/json"}, 5, b'{"a":1}'
            )
            await pool.close()
            assert got.status == 201
            return server.requests[0]

    head, _, body = (await scenario()).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /x?dryRun=All HTTP/1.1"
    assert lines[2:] == ["Content-Type: application/json", "Content-Length: 7"]
    assert body == b'{"a":1}'


async def test_a_post_on_a_reused_connection_that_fails_is_not_sent_twice() -> None:
    """The server may have applied it before the connection broke: the caller hears of the
    failure (and says "no answer") rather than the pool creating the object twice."""

    def drop_second(n: int, _request: bytes) -> tuple[bytes, bool]:
        return (b"", True) if n == 1 else (answer(), False)

    async def scenario() -> tuple[int, int]:
        async with raw_server(drop_second) as server:
            pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
            await pool.request("POST", "/x", {}, 5, b"{}")
            with pytest.raises(ConnectionError):
                await pool.request("POST", "/x", {}, 5, b"{}")
            await pool.close()
            return len(server.requests), server.connections

    assert await scenario() == (2, 1)


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@asynccontextmanager
async def stream_from(
    server: RawServer, time_limit: float = 5, path: str = "/w"
) -> AsyncIterator[HttpStream]:
    """A stream opened from the scripted server; it and its pool are closed on leaving."""
    pool = KeepAliveClient(f"http://127.0.0.1:{server.port}", ssl_context=None)
    stream = await pool.open_stream(path, {}, time_limit)
    try:
        yield stream
    finally:
        stream.close()
        await pool.close()


async def stream_refusal(wire: bytes, time_limit: float = 5) -> str:
    """The HttpProtocolError the first readline of a stream answered with `wire` raises."""

    async def scenario() -> str:
        async with raw_server(always(wire, close=True)) as server, stream_from(server, time_limit) as stream:
            with pytest.raises(HttpProtocolError) as raised:
                await stream.readline()
            return str(raised.value)

    return await scenario()


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b'{"a":1}\n{"b"', b":2}\n", b'{"c":3}'),
        b"Content-Length: 23\r\n\r\n" + b'{"a":1}\n{"b":2}\n{"c":3}',
        b"Connection: close\r\n\r\n" + b'{"a":1}\n{"b":2}\n{"c":3}',
    ],
    ids=["chunked", "length", "to-the-end"],
)
async def test_a_stream_comes_line_by_line_however_it_is_framed(framing: bytes) -> None:
    """A watch: events split across chunks are joined, the last line may lack its newline."""

    async def scenario() -> tuple[int, list[bytes], bytes]:
        async with raw_server(always(b"HTTP/1.1 200 OK\r\n" + framing, close=True)) as server:
            async with stream_from(server, path="/w?watch=true") as stream:
                lines = [line async for line in _lines(stream)]
            return stream.status, lines, server.requests[0].split(b"\r\n")[0]

    status, lines, request_line = await scenario()
    assert (status, request_line) == (200, b"GET /w?watch=true HTTP/1.1")
    assert lines == [b'{"a":1}\n', b'{"b":2}\n', b'{"c":3}']


async def _lines(stream: HttpStream) -> AsyncIterator[bytes]:
    while line := await stream.readline():
        yield line


async def test_a_stream_that_goes_quiet_past_its_deadline_times_out() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b'8\r\n{"a":1}\n\r\n'
    async with raw_server(always(head)) as server, stream_from(server, 0.3) as stream:
        assert await stream.readline() == b'{"a":1}\n'
        with pytest.raises(TimeoutError):
            await stream.readline()


async def test_a_refused_stream_gives_its_whole_answer() -> None:
    """410 Gone and the like: the Status object the caller words its error from."""

    async def scenario() -> tuple[int, bytes]:
        refusal = always(answer(b'{"code":410}', "410 Gone"))
        async with raw_server(refusal) as server, stream_from(server) as stream:
            return stream.status, await stream.read_all()

    assert await scenario() == (410, b'{"code":410}')


async def test_through_a_proxy_a_plain_http_request_names_the_whole_url() -> None:
    """RFC 9112 3.2.2: the proxy is sent the absolute URL, and the credentials the proxy URL
    carries as Proxy-Authorization."""

    async def scenario() -> bytes:
        async with raw_server(always(answer())) as proxy:
            pool = KeepAliveClient(
                "http://apiserver.test:8080/prefix",
                ssl_context=None,
                proxy=f"http://user:pa%20ss@127.0.0.1:{proxy.port}",
            )
            await pool.request("GET", "/version", {"Accept": "application/json"}, 5)
            await pool.close()
            return proxy.requests[0]

    lines = (await scenario()).decode().split("\r\n")
    assert lines[0] == "GET http://apiserver.test:8080/prefix/version HTTP/1.1"
    assert "Host: apiserver.test:8080" in lines
    assert "Proxy-Authorization: Basic dXNlcjpwYSBzcw==" in lines  # user:pa ss


@pytest.mark.parametrize("proxy", ["https://proxy.test:3128", "socks5://proxy.test:1080", "http://"])
def test_a_proxy_that_is_not_an_http_url_is_refused(proxy: str) -> None:
    with pytest.raises(ValueError, match="proxy: expected an http:// URL"):
        KeepAliveClient("https://apiserver.test:6443", ssl_context=None, proxy=proxy)


async def test_a_stream_may_run_past_the_body_limit_but_no_line_past_the_line_limit() -> None:
    """A watch runs for minutes: its total is not capped, each event is. A line the server never
    ends is an error naming the line limit, not memory spent without end."""
    piece = b"x" * (1024 * 1024)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    endless = head + b"".join(
        b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(MAX_LINE_BYTES // len(piece) + 2)
    )
    assert await stream_refusal(endless, 30) == f"line: more than the {MAX_LINE_BYTES} bytes allowed"


async def test_a_watch_chunk_larger_than_an_event_can_be_is_refused_before_it_is_read() -> None:
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % (MAX_LINE_BYTES + 1)
    assert "chunk size" in await stream_refusal(wire)


async def test_a_list_far_larger_than_any_object_is_read_whole() -> None:
    """Lists (every ResourceClaim of a cluster, for `dra-driver plan`) may be far above the 1.5 MiB
    of one object, and above a watch event's limit."""
    body = b"[" + b"0," * (MAX_LINE_BYTES // 2 + 1024) + b"0]"

    async def scenario() -> tuple[int, int]:
        async with raw_server(always(answer(body))) as server:
            got = await get_from(server)
            return got[0], len(got[1])

    assert await scenario() == (200, len(body))
    assert MAX_BODY_BYTES > len(body) > MAX_LINE_BYTES
