"""The agent's Kubernetes client: the operator's proxy, found once at start, not per request.

The agent's own HTTP client never looks at the environment; `kubernetes_api_client` resolves the
proxy the environment names for the API server (HTTPS_PROXY or HTTP_PROXY by its scheme, unless
NO_PROXY exempts its host) once, a kubeconfig's proxy-url first, and every request then goes
through it: a tiny proxy here records what arrives.
"""

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.agent.errors import StartupError
from dra_driver.agent.kube_client import environment_proxy, kubernetes_api_client
from dra_driver.kube.calls import json_call
from dra_driver.kube.kube_api import call

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The test's own proxy environment, none of the machine's."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


@pytest.mark.parametrize(
    ("variables", "url", "expected"),
    [
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://10.96.0.1:443", "http://proxy:3128"),
        ({"https_proxy": "http://proxy:3128"}, "https://10.96.0.1:443", "http://proxy:3128"),
        ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.96.0.1"}, "https://10.96.0.1:443", None),
        ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".svc"}, "https://kubernetes.default.svc", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://10.96.0.1:443", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://10.96.0.1:8080", "http://proxy:3128"),
        ({}, "https://10.96.0.1:443", None),
    ],
)
def test_the_proxy_is_the_one_the_environment_names_for_the_api_server(
    variables: dict[str, str], url: str, expected: str | None, environment: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        environment.setenv(name, value)
    assert environment_proxy(url) == expected


def write_kubeconfig(path: Path, server: str, proxy_url: str | None = None) -> Path:
    cluster: dict[str, Any] = {"server": server}
    if proxy_url is not None:
        cluster["proxy-url"] = proxy_url
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "ctx",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "abc"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return path


async def client_proxy(kubeconfig: Path) -> str | None:
    client = await kubernetes_api_client(kubeconfig)
    await client.close()
    return client.server.proxy


@pytest.mark.parametrize(
    ("variables", "server", "expected"),
    [
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://10.96.0.1:443", "http://proxy:3128"),
        ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.96.0.1"}, "https://10.96.0.1:443", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://apiserver.test:8080", "http://proxy:3128"),
        ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": ".test"}, "http://apiserver.test:8080", None),
        ({}, "https://10.96.0.1:443", None),
    ],
)
async def test_the_client_is_made_with_the_environments_proxy(
    variables: dict[str, str],
    server: str,
    expected: str | None,
    environment: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name, value in variables.items():
        environment.setenv(name, value)
    assert await client_proxy(write_kubeconfig(tmp_path / "kubeconfig", server)) == expected


async def test_a_kubeconfigs_proxy_url_wins_over_the_environment(
    environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    environment.setenv("HTTPS_PROXY", "http://environment-proxy:3128")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://10.96.0.1:443", "http://kube-proxy:3128")
    assert await client_proxy(kubeconfig) == "http://kube-proxy:3128"


@asynccontextmanager
async def recording_proxy() -> AsyncIterator[tuple[int, list[list[str]]]]:
    """A forward proxy that answers every request itself: a plain-http one with a JSON object,
    a CONNECT with 403. Yields its port and, per request, its head's lines."""
    heads: list[list[str]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.split("\r\n")[:-2]
                heads.append(lines)
                if lines[0].startswith("CONNECT "):
                    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    await writer.drain()
                    return
                body = b'{"major": "1", "minor": "35"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], heads
    finally:
        server.close()
        await server.wait_closed()


def header(lines: list[str], name: str) -> str | None:
    found = [line.partition(":")[2].strip() for line in lines[1:] if line.partition(":")[0].lower() == name]
    assert len(found) <= 1, lines
    return found[0] if found else None


async def through_proxy(tmp_path: Path, environment: pytest.MonkeyPatch, credentials: str) -> list[list[str]]:
    """A GET through the proxy HTTP_PROXY names, to an API server whose name does not resolve
    (`.invalid`): only the proxy can answer it."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://apiserver.invalid:8080")

    async with recording_proxy() as (port, heads):
        environment.setenv("HTTP_PROXY", f"http://{credentials}127.0.0.1:{port}")
        client = await kubernetes_api_client(kubeconfig)
        try:
            answer = await json_call("version", call(client, "GET", "/version", request_timeout=5))
        finally:
            await client.close()
        assert answer == {"major": "1", "minor": "35"}
        return heads


async def test_a_request_goes_through_the_environments_proxy(
    environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The absolute-form target (RFC 9112 3.2.2) and the server's Host, the bearer token for the
    server; no Proxy-Authorization where the proxy URL has no user."""
    [head] = await through_proxy(tmp_path, environment, "")
    assert head[0] == "GET http://apiserver.invalid:8080/version HTTP/1.1"
    assert header(head, "host") == "apiserver.invalid:8080"
    assert header(head, "authorization") == "Bearer abc"
    assert header(head, "proxy-authorization") is None


async def test_the_proxy_urls_user_and_password_become_proxy_authorization(
    environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Percent-escapes in the URL are undone first: the password is `pa ss`."""
    [head] = await through_proxy(tmp_path, environment, "user:pa%20ss@")
    assert head[0] == "GET http://apiserver.invalid:8080/version HTTP/1.1"
    assert header(head, "proxy-authorization") == "Basic " + base64.b64encode(b"user:pa ss").decode()


async def test_an_https_server_is_reached_through_a_tunnel_the_environments_proxy_opens(
    environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HTTPS_PROXY for an https server: a CONNECT, with the proxy's credentials, and nothing for
    the server in the clear; the proxy here refuses the tunnel, which the call reports."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://apiserver.invalid:6443")

    async def refused() -> tuple[str, list[list[str]]]:
        async with recording_proxy() as (port, heads):
            environment.setenv("HTTPS_PROXY", f"http://user:secret@127.0.0.1:{port}")
            client = await kubernetes_api_client(kubeconfig)
            try:
                with pytest.raises(ConnectionRefusedError) as raised:
                    await call(client, "GET", "/version", request_timeout=5)
            finally:
                await client.close()
            return str(raised.value), heads

    message, [head] = await refused()
    assert "answered 403 to CONNECT apiserver.invalid:6443" in message
    assert head[0] == "CONNECT apiserver.invalid:6443 HTTP/1.1"
    assert header(head, "proxy-authorization") == "Basic " + base64.b64encode(b"user:secret").decode()
    assert header(head, "authorization") is None


async def test_a_proxy_that_is_no_http_url_stops_the_start_naming_it(
    tmp_path: Path, environment: pytest.MonkeyPatch
) -> None:
    """HTTPS_PROXY=proxy:3128, a common slip: said at start, not found at the first call."""
    environment.setenv("HTTPS_PROXY", "proxy.example:3128")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://10.96.0.1:443")
    with pytest.raises(
        StartupError, match=r"cannot reach the Kubernetes API: proxy: expected an http:// URL"
    ):
        await kubernetes_api_client(kubeconfig)
