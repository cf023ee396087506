"""Keep-alive HTTP/1.1 GETs for the one request on the pod-startup path: the claim.

Every NodePrepareResources GETs each of its claims, and through aiohttp's `ClientSession` one GET
cost the agent about 0.2 ms of CPU (timeout handles, tracing hooks, the cookie jar, URL and
request/response objects built per call), more than the rest of the HTTP exchange together. This
client does the one thing that path needs, a GET of a small JSON object over a pooled connection,
in under half that. Everything else (lists, watches, writes, any request through a proxy) stays
on the official client's REST layer.

What it takes from the official client rather than deciding itself: the server URL, the TLS
context (CA, client certificate, verification: `RESTClientObject.ssl_context`), the TLS server
name, and the headers, bearer token included (kube_api.request_headers). It sends no
Accept-Encoding, so the answer is never compressed.

Strict on what comes back, as the rest of the agent is: a status line, header or chunk it cannot
parse is an `HttpProtocolError` naming it, and that connection is closed. A pooled connection that
turns out closed by the server (keep-alive timeouts) is dropped and the request sent again on
another or a new one: a GET is idempotent.
"""

import asyncio
import ssl
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlsplit

# Far above any ResourceClaim (etcd stores at most 1.5 MiB per object).
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class HttpProtocolError(ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class _Head:
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


def _content_length(headers: Mapping[str, str]) -> int:
    text = headers["content-length"]
    if not text.isdigit():
        raise HttpProtocolError(f"Content-Length: expected a number of bytes, got {text[:40]!r}")
    length = int(text)
    if length > MAX_BODY_BYTES:
        raise HttpProtocolError(f"Content-Length: {length} bytes is more than the {MAX_BODY_BYTES} allowed")
    return length


async def _chunked_body(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = (await reader.readuntil(b"\r\n"))[:-2]
        size_text = size_line.split(b";", 1)[0].strip()
        if not size_text or size_text.strip(_HEX_DIGITS):
            raise HttpProtocolError(f"chunk size: expected hexadecimal, got {size_line[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields: nothing in them is for us
            return b"".join(parts)
        total += size
        if total > MAX_BODY_BYTES:
            raise HttpProtocolError(f"chunked body: more than the {MAX_BODY_BYTES} bytes allowed")
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise HttpProtocolError("chunk: expected CRLF after its data")


async def _read_answer(reader: asyncio.StreamReader) -> tuple[HttpAnswer, bool]:
    """The answer, and whether the connection may carry another request."""
    while True:
        try:
            head = _parse_head(await reader.readuntil(b"\r\n\r\n"))
        except asyncio.LimitOverrunError:
            raise HttpProtocolError(f"head: longer than {MAX_HEAD_BYTES} bytes") from None
        if not 100 <= head.status < 200:
            break  # 1xx answers (103 Early Hints) come before the real one
    headers = head.headers
    if head.status in _NO_BODY_STATUSES:
        return HttpAnswer(head.status, b""), head.keep_alive
    if "content-encoding" in headers and headers["content-encoding"].lower() != "identity":
        raise HttpProtocolError(f"Content-Encoding: not asked for, got {headers['content-encoding'][:40]!r}")
    encoding = headers.get("transfer-encoding", "").lower()
    if encoding:
        if encoding != "chunked":
            raise HttpProtocolError(f"Transfer-Encoding: expected chunked, got {encoding[:40]!r}")
        return HttpAnswer(head.status, await _chunked_body(reader)), head.keep_alive
    if "content-length" in headers:
        body = await reader.readexactly(_content_length(headers))
        return HttpAnswer(head.status, body), head.keep_alive
    # No length: the body runs to the end of the connection (RFC 9112 6.3).
    parts: list[bytes] = []
    total = 0
    while chunk := await reader.read(65536):
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise HttpProtocolError(f"body: more than the {MAX_BODY_BYTES} bytes allowed")
        parts.append(chunk)
    body = b"".join(parts)
    return HttpAnswer(head.status, body), False


def _request_bytes(target: str, host: str, headers: Mapping[str, str]) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"header {name}: a value with a line break or NUL cannot be sent")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class KeepAliveClient:
    """GETs on at most `max_connections` pooled connections to one server."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None,
        tls_server_name: str | None = None,
        max_connections: int = 8,
    ) -> None:
        """`server`: the API server's URL as configured (it may carry a path prefix)."""
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server: expected an http(s) URL with a host, got {server!r}")
        self._https = parts.scheme == "https"
        self._hostname = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._host_header = parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._ssl_context = ssl_context if self._https else None
        self._server_hostname = (tls_server_name or self._hostname) if self._https else None
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self.connections_opened = 0  # for tests: how often the pool had to open one

    async def get(self, path: str, headers: Mapping[str, str], time_limit: float) -> HttpAnswer:
        """GET `path` (under the server's prefix). Raises OSError (connection or TLS trouble),
        HttpProtocolError (an answer it cannot read), TimeoutError (no whole answer within
        `time_limit` seconds)."""
        request = _request_bytes(self._prefix + path, self._host_header, headers)
        async with asyncio.timeout(time_limit), self._slots:
            while self._idle:
                connection = self._idle.pop()
                if connection.reader.at_eof():
                    connection.close()
                    continue
                try:
                    return await self._exchange(connection, request)
                except ConnectionError:
                    pass  # closed by the server while idle: try again on a new connection
            return await self._exchange(await self._open(), request)

    async def open_ahead(self, time_limit: float) -> None:
        """Opens a connection for the next GET to take: the agent's first claim GET would
        otherwise pay the TCP and TLS handshakes with the API server inside kubelet's first
        prepare. Best effort: a connection that cannot be opened now is the first GET's to open
        (and to report), and one the server closes while idle is replaced as any other is."""
        with suppress(OSError, TimeoutError):
            async with asyncio.timeout(time_limit), self._slots:
                self._idle.append(await self._open())

    async def _open(self) -> _Connection:
        reader, writer = await asyncio.open_connection(
            self._hostname,
            self._port,
            ssl=self._ssl_context,
            server_hostname=self._server_hostname,
            limit=MAX_HEAD_BYTES,
        )
        self.connections_opened += 1
        return _Connection(reader, writer)

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
