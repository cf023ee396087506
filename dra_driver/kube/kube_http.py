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
parse is an `HttpProtocolError` naming it, and that connection is closed. A pooled connection that
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

from dra_driver.base.errors import TransientFault

# A whole answer: lists included, the largest being every ResourceClaim of a large cluster (read
# by `dra-driver plan`). A guard against a broken server, not a size any real answer nears.
MAX_BODY_BYTES = 256 * 1024 * 1024
# One line of a watch, one event: far above any object (etcd stores at most 1.5 MiB per object).
# A watch's stream as a whole has no limit: it runs for minutes.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
_HEX_DIGITS = b"0123456789abcdefABCDEF"
# Sent again on a fresh connection when a pooled one was found closed (RFC 9110 9.2.2).
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


class HttpProtocolError(TransientFault, ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class HttpAnswer(msgspec.Struct, frozen=True):
    status: int
    body: bytes


class _Head(msgspec.Struct, frozen=True):
    status: int
    headers: dict[str, str]
    keep_alive: bool


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


def _parse_head(raw: bytes) -> _Head:
    lines = raw.decode("latin-1").split("\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit() or rest[3:4] not in ("", " "):
        raise HttpProtocolError(f"status line: expected 'HTTP/1.x NNN reason', got {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpProtocolError(f"header line: expected 'name: value', got {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        # Repeated headers are one comma-separated list (RFC 9110 5.3).
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    tokens = {token.strip().lower() for token in headers.get("connection", "").split(",")}
    keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
    return _Head(int(code), headers, keep_alive)


async def _read_head(reader: asyncio.StreamReader) -> _Head:
    """The final answer's head: 1xx answers (103 Early Hints) come before it and are skipped."""
    while True:
        try:
            head = _parse_head(await reader.readuntil(b"\r\n\r\n"))
        except asyncio.LimitOverrunError:
            raise HttpProtocolError(f"head: longer than {MAX_HEAD_BYTES} bytes") from None
        if not 100 <= head.status < 200:
            return head


def _content_length(headers: Mapping[str, str], limit: int | None) -> int:
    text = headers["content-length"]
    if not text.isdigit():
        raise HttpProtocolError(f"Content-Length: expected a number of bytes, got {text[:40]!r}")
    length = int(text)
    if limit is not None and length > limit:
        raise HttpProtocolError(f"Content-Length: {length} bytes is more than the {limit} allowed")
    return length


class _Body:
    """An answer's body, piece by piece, however HTTP frames it: chunked, of a given length, or
    up to the end of the connection (RFC 9112 6.3). `limit`: the most bytes it may have, None
    for none (a watch)."""

    def __init__(self, reader: asyncio.StreamReader, head: _Head, limit: int | None) -> None:
        self._reader = reader
        self._limit = limit
        headers = head.headers
        coding = headers.get("content-encoding", "identity")
        if coding.lower() != "identity":
            raise HttpProtocolError(f"Content-Encoding: not asked for, got {coding[:40]!r}")
        encoding = headers.get("transfer-encoding", "").lower()
        if encoding and encoding != "chunked":
            raise HttpProtocolError(f"Transfer-Encoding: expected chunked, got {encoding[:40]!r}")
        self._chunked = bool(encoding)
        self._left: int | None = None  # bytes still to come; None: to the end of the connection
        if head.status in _NO_BODY_STATUSES:
            self._left = 0
        elif not self._chunked and "content-length" in headers:
            self._left = _content_length(headers, limit)
        self.delimited = self._chunked or self._left is not None
        self._done = self._left == 0
        self._total = 0

    async def piece(self) -> bytes:
        """The next part of the body; b"" once it is all read."""
        if self._done:
            return b""
        if self._chunked:
            data = await self._chunk()
        elif self._left is not None:
            data = await self._reader.readexactly(min(self._left, 65536))
            self._left -= len(data)
        else:
            data = await self._reader.read(65536)
        self._done = not data or self._left == 0
        self._total += len(data)
        if self._limit is not None and self._total > self._limit:
            raise HttpProtocolError(f"body: more than the {self._limit} bytes allowed")
        return data

    async def _chunk(self) -> bytes:
        reader = self._reader
        size_line = (await reader.readuntil(b"\r\n"))[:-2]
        size_text = size_line.split(b";", 1)[0].strip()
        if not size_text or size_text.strip(_HEX_DIGITS):
            raise HttpProtocolError(f"chunk size: expected hexadecimal, got {size_line[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields: nothing in them is for us
            return b""
        if self._limit is not None and self._total + size > self._limit:
            raise HttpProtocolError(f"chunked body: more than the {self._limit} bytes allowed")
        if self._limit is None and size > MAX_LINE_BYTES:  # a watch: the server writes an event a chunk
            raise HttpProtocolError(f"chunk size: {size} bytes, more than a watch's {MAX_LINE_BYTES}")
        data = await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise HttpProtocolError("chunk: expected CRLF after its data")
        return data

    async def whole(self) -> bytes:
        if self._left is not None and not self._chunked:  # the common case: one read
            data = await self._reader.readexactly(self._left) if self._left else b""
            self._left, self._done = 0, True
            return data
        parts = []
        while part := await self.piece():
            parts.append(part)
        return b"".join(parts)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[HttpAnswer, bool]:
    """The answer, and whether the connection may carry another request."""
    head = await _read_head(reader)
    body = _Body(reader, head, MAX_BODY_BYTES)
    return HttpAnswer(head.status, await body.whole()), head.keep_alive and body.delimited


class HttpStream:
    """An answer whose body is read as it comes, on a connection of its own: a watch. Every read
    must end by the deadline the stream was opened with (TimeoutError)."""

    def __init__(self, connection: _Connection, head: _Head, deadline: float) -> None:
        self.status = head.status
        self._connection = connection
        self._body = _Body(connection.reader, head, None)
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


def _request_bytes(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"header {name}: a value with a line break or NUL cannot be sent")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if body is None else head + body


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
        request = _request_bytes(method, self._prefix + path, self._host_header, self._headers(headers), body)
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
        request = _request_bytes("GET", self._prefix + path, self._host_header, self._headers(headers), None)
        deadline = asyncio.get_running_loop().time() + time_limit
        async with asyncio.timeout_at(deadline):
            connection = await self._open()
            try:
                connection.writer.write(request)
                head = await _read_head(connection.reader)
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
        writer.write(_request_bytes("CONNECT", authority, authority, headers, None))
        head = await _read_head(reader)
        if not 200 <= head.status < 300:
            raise ConnectionRefusedError(
                f"proxy {proxy.host}:{proxy.port} answered {head.status} to CONNECT {authority}"
            )
        await writer.start_tls(ssl_context, server_hostname=self._server_hostname)

    async def _exchange(self, connection: _Connection, request: bytes) -> HttpAnswer:
        reusable = False
        try:
            connection.writer.write(request)
            answer, reusable = await _read_answer(connection.reader)
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
