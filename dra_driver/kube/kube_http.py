"""The agent's HTTP/1.1 client for the Kubernetes API: keep-alive requests and watch streams.

Every API call of the agent is a small JSON request or a watch, and through aiohttp a claim GET
cost the agent about 0.2 ms of CPU (timeout handles, tracing hooks, the cookie jar, URL and
request/response objects built per call), more than the rest of the exchange together; importing
aiohttp, with the two TLS contexts it builds from the system CA bundle at import, was the largest
single part of the agent's start (issue 31). This client does what the agent needs and no more:
requests with a JSON body or none over pooled connections, and a GET whose body is read as it
comes (a watch) on a connection of its own; directly or through an HTTP proxy (CONNECT for an
https server). It sends no Accept-Encoding, so an answer is never compressed.

Strict on what comes back, as the rest of the agent is: a status line, header or chunk it cannot
parse is an `HttpProtocolError` naming it (`http_wire.py` reads the bytes), and that connection
is closed. A pooled connection that
turns out closed by the server (keep-alive timeouts) is dropped and an idempotent request sent
again on another or a new one; a POST is not sent twice, its caller hears "no answer".
"""

import asyncio
import base64
import ssl
from collections.abc import Mapping
from contextlib import suppress
from urllib.parse import unquote, urlsplit

import msgspec

from dra_driver.kube.http_wire import (
    MAX_HEAD_BYTES,
    MAX_LINE_BYTES,
    Body,
    Head,
    HttpAnswer,
    HttpProtocolError,
    read_answer,
    read_head,
    request_bytes,
)

# Sent again on a fresh connection when a pooled one was found closed (RFC 9110 9.2.2).
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class HttpStream:
    """An answer whose body is read as it comes, on a connection of its own: a watch. Every read
    must end by the deadline the stream was opened with (TimeoutError)."""

    def __init__(self, connection: _Connection, head: Head, deadline: float) -> None:
        self.status = head.status
        self._connection = connection
        self._body = Body(connection.reader, head, None)
        self._deadline = deadline
        self._buffer = b""

    async def readline(self) -> bytes:
        """The next line, its b"\\n" included; the last one may lack it; b"" at the end."""
        async with asyncio.timeout_at(self._deadline):
            while (end := self._buffer.find(b"\n")) < 0:
                piece = await self._body.piece()
                if not piece:
                    line, self._buffer = self._buffer, b""
                    return line
                self._buffer += piece
                if len(self._buffer) > MAX_LINE_BYTES:
                    raise HttpProtocolError(f"line: more than the {MAX_LINE_BYTES} bytes allowed")
        line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
        return line

    async def read_all(self) -> bytes:
        """The rest of the body (an error's Status), at most MAX_LINE_BYTES of it."""
        async with asyncio.timeout_at(self._deadline):
            while len(self._buffer) <= MAX_LINE_BYTES and (piece := await self._body.piece()):
                self._buffer += piece
        return self._buffer[:MAX_LINE_BYTES]

    def close(self) -> None:
        self._connection.close()


class _Proxy(msgspec.Struct, frozen=True):
    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization the URL's user and password make


def _proxy(url: str) -> _Proxy:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"proxy: expected an http:// URL with a host, got {url!r}")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
    return _Proxy(parts.hostname, parts.port or 80, authorization)


class KeepAliveClient:
    """Requests on at most `max_connections` pooled connections to one server, and watch streams
    on connections of their own."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None,
        tls_server_name: str | None = None,
        proxy: str | None = None,
        max_connections: int = 8,
    ) -> None:
        """`server`: the API server's URL as configured (it may carry a path prefix); `proxy`:
        an http:// proxy URL, user and password allowed."""
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server: expected an http(s) URL with a host, got {server!r}")
        self._https = parts.scheme == "https"
        self._hostname = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._host_header = parts.netloc
        self._proxy = None if proxy is None else _proxy(proxy)
        # Through a proxy a plain-http request names the whole URL (RFC 9112 3.2.2).
        origin = f"http://{parts.netloc}" if self._proxy is not None and not self._https else ""
        self._prefix = origin + parts.path.rstrip("/")
        # An https server is never spoken to in the clear: no context given, the system's default.
        self._ssl_context = (ssl_context or ssl.create_default_context()) if self._https else None
        self._server_hostname = (tls_server_name or self._hostname) if self._https else None
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self.connections_opened = 0  # for tests: how often the pool had to open one

    async def request(
        self, method: str, path: str, headers: Mapping[str, str], time_limit: float, body: bytes | None = None
    ) -> HttpAnswer:
        """`method` `path` (under the server's prefix; with its query), answered whole. Raises
        OSError (connection or TLS trouble), HttpProtocolError (an answer it cannot read),
        TimeoutError (no whole answer within `time_limit` seconds)."""
        request = request_bytes(method, self._prefix + path, self._host_header, self._headers(headers), body)
        async with asyncio.timeout(time_limit), self._slots:
            while self._idle:
                connection = self._idle.pop()
                # Hung up (EOF read) or reset while idle: uvloop closes a reset connection's
                # transport, and a write to a closed transport raises RuntimeError there.
                if connection.reader.at_eof() or connection.writer.is_closing():
                    connection.close()
                    continue
                try:
                    return await self._exchange(connection, request)
                except ConnectionError:
                    if method not in _IDEMPOTENT:
                        raise  # it may have been applied: not sent twice
                    # closed by the server while idle: try again on a new connection
            return await self._exchange(await self._open(), request)

    async def open_stream(self, path: str, headers: Mapping[str, str], time_limit: float) -> HttpStream:
        """A GET of `path` whose body the caller reads as it comes, within `time_limit` seconds
        from now, on a new connection that closing the stream closes. Raises as `request`."""
        request = request_bytes("GET", self._prefix + path, self._host_header, self._headers(headers), None)
        deadline = asyncio.get_running_loop().time() + time_limit
        async with asyncio.timeout_at(deadline):
            connection = await self._open()
            try:
                connection.writer.write(request)
                head = await read_head(connection.reader)
                return HttpStream(connection, head, deadline)
            except BaseException:
                connection.close()
                raise

    def _headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        if self._proxy is None or self._https or self._proxy.authorization is None:
            return headers
        return {**headers, "Proxy-Authorization": self._proxy.authorization}

    async def open_ahead(self, time_limit: float) -> None:
        """Opens a connection for the next request to take: the agent's first claim GET would
        otherwise pay the TCP and TLS handshakes with the API server inside kubelet's first
        prepare. Best effort: a connection that cannot be opened now is the first request's to
        open (and to report), and one the server closes while idle is replaced as any other is."""
        with suppress(OSError, TimeoutError, HttpProtocolError):
            async with asyncio.timeout(time_limit), self._slots:
                self._idle.append(await self._open())

    async def _open(self) -> _Connection:
        if self._proxy is None:
            reader, writer = await asyncio.open_connection(
                self._hostname,
                self._port,
                ssl=self._ssl_context,
                server_hostname=self._server_hostname,
                limit=MAX_HEAD_BYTES,
            )
        else:
            reader, writer = await asyncio.open_connection(
                self._proxy.host, self._proxy.port, limit=MAX_HEAD_BYTES
            )
            if self._ssl_context is not None:
                try:
                    await self._tunnel(self._proxy, self._ssl_context, reader, writer)
                except BaseException:
                    writer.close()
                    raise
        self.connections_opened += 1
        return _Connection(reader, writer)

    async def _tunnel(
        self,
        proxy: _Proxy,
        ssl_context: ssl.SSLContext,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Asks the proxy for a tunnel to the server (CONNECT) and starts TLS inside it."""
        authority = f"{self._hostname}:{self._port}"
        if ":" in self._hostname:  # an IPv6 address
            authority = f"[{self._hostname}]:{self._port}"
        headers = {} if proxy.authorization is None else {"Proxy-Authorization": proxy.authorization}
        writer.write(request_bytes("CONNECT", authority, authority, headers, None))
        head = await read_head(reader)
        if not 200 <= head.status < 300:
            raise ConnectionRefusedError(
                f"proxy {proxy.host}:{proxy.port} answered {head.status} to CONNECT {authority}"
            )
        await writer.start_tls(ssl_context, server_hostname=self._server_hostname)

    async def _exchange(self, connection: _Connection, request: bytes) -> HttpAnswer:
        reusable = False
        try:
            connection.writer.write(request)
            answer, reusable = await read_answer(connection.reader)
        except asyncio.IncompleteReadError as error:
            raise ConnectionResetError(f"the server closed the connection mid-answer: {error}") from error
        finally:
            if reusable:
                self._idle.append(connection)
            else:
                connection.close()
        return answer

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for connection in idle:
            with suppress(OSError):  # already broken: closed is closed
                await connection.writer.wait_closed()
