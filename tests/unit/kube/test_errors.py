"""Every way an API call fails becomes one ApiError, from real aiohttp exceptions on real sockets
and real answers: no answer (refused, reset, timed out, not HTTP), and each status the callers
branch on."""

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from dra_driver.base.errors import TransientFault
from dra_driver.kube.calls import json_call, json_get
from dra_driver.kube.errors import ApiError
from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.kube.server_access import ServerAccess

PREDICATES = ("no_answer", "expired", "not_found", "conflict")


def predicates(error: ApiError) -> set[str]:
    """The predicates that hold, and "final" where the error is not a TransientFault (the class,
    chosen by the status, says whether another try may help)."""
    final = set() if isinstance(error, TransientFault) else {"final"}
    return {name for name in PREDICATES if getattr(error, name)} | final


@asynccontextmanager
async def server(answer: bytes | None, *, hang: bool = False) -> AsyncIterator[str]:
    """A socket server that reads the request head, then sends `answer` (None: closes at once,
    a reset; `hang`: never answers)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if hang:
            await asyncio.sleep(3600)
        if answer is not None:
            writer.write(answer)
            await writer.drain()
        writer.close()

    listening = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        listening.close()


def http_answer(status: int, body: object) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + data


def status_object(code: int, reason: str) -> dict[str, object]:
    return {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": f"said {code}"}


async def failed_call(url: str, seconds: float = 5.0) -> ApiError:
    client = KubeClient(ServerAccess(url))
    try:
        with pytest.raises(ApiError) as raised:
            await json_call("GET thing", call(client, "GET", "/thing", request_timeout=seconds))
    finally:
        await client.close()
    return raised.value


async def failed_lean_get(url: str, seconds: float = 5.0) -> ApiError:
    client = KubeClient(ServerAccess(url))
    try:
        with pytest.raises(ApiError) as raised:
            await json_get(client, "GET thing", "/thing", {}, seconds)
    finally:
        await client.close()
    return raised.value


def free_port_url() -> str:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{unused.getsockname()[1]}"


@pytest.mark.parametrize("failed", [failed_call, failed_lean_get], ids=["REST layer", "lean pool"])
async def test_a_refused_connection_is_no_answer(failed: object) -> None:
    error = await failed(free_port_url())  # type: ignore[operator]

    assert predicates(error) == {"no_answer"}
    assert str(error).startswith("GET thing: no answer: ")


@pytest.mark.parametrize("failed", [failed_call, failed_lean_get], ids=["REST layer", "lean pool"])
async def test_a_connection_closed_before_the_answer_is_no_answer(failed: object) -> None:
    async def run() -> ApiError:
        async with server(None) as url:
            return await failed(url)  # type: ignore[operator,no-any-return]

    assert predicates(await run()) == {"no_answer"}


@pytest.mark.parametrize("failed", [failed_call, failed_lean_get], ids=["REST layer", "lean pool"])
async def test_a_timeout_is_no_answer(failed: object) -> None:
    async def run() -> ApiError:
        async with server(None, hang=True) as url:
            return await failed(url, 0.2)  # type: ignore[operator,no-any-return]

    error = await run()
    assert predicates(error) == {"no_answer"}
    assert error.message  # a TimeoutError says nothing: its type name stands in


async def test_an_answer_that_is_not_http_is_no_answer_in_the_lean_pool() -> None:
    async def run() -> ApiError:
        async with server(b"SSH-2.0-OpenSSH\r\n\r\n") as url:
            return await failed_lean_get(url)

    error = await run()
    assert predicates(error) == {"no_answer"}
    assert "status line" in error.message


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (410, "Expired", {"expired"}),
        (404, "NotFound", {"not_found", "final"}),
        (409, "Conflict", {"conflict"}),
        (400, "BadRequest", {"final"}),
        (403, "Forbidden", {"final"}),
        (422, "Invalid", {"final"}),
        (401, "Unauthorized", set()),  # a token read afresh may pass
        (500, "InternalError", set()),
        (503, "ServiceUnavailable", set()),
    ],
)
async def test_each_status_answers_its_predicate(status: int, reason: str, expected: set[str]) -> None:
    async def run() -> ApiError:
        async with server(http_answer(status, status_object(status, reason))) as url:
            return await failed_call(url)

    error = await run()
    assert predicates(error) == expected
    assert (error.call, error.status, error.reason, error.message) == (
        "GET thing",
        status,
        reason,
        f"said {status}",
    )
    assert str(error) == f"GET thing: API server answered {status} {reason}: said {status}"


async def test_an_answer_without_a_status_object_still_says_something() -> None:
    async def run() -> ApiError:
        async with server(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\nConnection: close\r\n\r\nproxy error"
        ) as url:
            return await failed_call(url)

    assert str(await run()) == "GET thing: API server answered 502: proxy error"


async def test_an_expected_status_with_a_body_that_is_not_json_is_an_error_of_that_status() -> None:
    async def run() -> ApiError:
        async with server(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n<html") as url:
            return await failed_call(url)

    error = await run()
    assert (error.status, predicates(error)) == (200, set())
    assert error.message.startswith("invalid JSON: ")
