"""HTTP/1.1 as bytes, for the agent's client (`kube_http.py`): a request written out, and an
answer's head and body read back, strictly.

Apart from the client because it is the protocol, not the connections: what is sent and how an
answer is framed (chunked, of a given length, or to the end of the connection; 1xx answers
skipped) is decided here from bytes and headers alone, while `kube_http.py` decides which
connection carries a request, when one is reused, opened, tunnelled through a proxy or closed.
Whatever this module cannot parse is an `HttpProtocolError` naming the part, and the client
closes that connection.
"""

import asyncio
from collections.abc import Mapping

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


class HttpProtocolError(TransientFault, ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class HttpAnswer(msgspec.Struct, frozen=True):
    status: int
    body: bytes


class Head(msgspec.Struct, frozen=True):
    status: int
    headers: dict[str, str]
    keep_alive: bool


def parse_head(raw: bytes) -> Head:
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
    return Head(int(code), headers, keep_alive)


async def read_head(reader: asyncio.StreamReader) -> Head:
    """The final answer's head: 1xx answers (103 Early Hints) come before it and are skipped."""
    while True:
        try:
            head = parse_head(await reader.readuntil(b"\r\n\r\n"))
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


class Body:
    """An answer's body, piece by piece, however HTTP frames it: chunked, of a given length, or
    up to the end of the connection (RFC 9112 6.3). `limit`: the most bytes it may have, None
    for none (a watch)."""

    def __init__(self, reader: asyncio.StreamReader, head: Head, limit: int | None) -> None:
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


async def read_answer(reader: asyncio.StreamReader) -> tuple[HttpAnswer, bool]:
    """The answer, and whether the connection may carry another request."""
    head = await read_head(reader)
    body = Body(reader, head, MAX_BODY_BYTES)
    return HttpAnswer(head.status, await body.whole()), head.keep_alive and body.delimited


def request_bytes(
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
