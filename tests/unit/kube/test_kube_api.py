"""dra_driver.kube.kube_api: the agent's own requests are the ones the official client's generated
API methods make, as they arrive at a server; the agent reaches the API server without aiohttp,
the official client or pydantic; the official kubeconfig loader (`kube.official_loader`, for
exec-plugin credentials) loads without its packages' eager __init__; the credentials come from a
kubeconfig or the service account, a rotated token file read again.

Both clients send to one raw socket server in the test, which records each request as it came:
request line, headers, body. aiohttp, under the official client, re-normalises every URL it is
given (it decodes %3A and the like, resolves `.` and `..`); for the exact comparison of request
targets the official client's session is handed its URLs as already encoded, so what arrives is
what the generated methods built, and a second check compares with what aiohttp makes of them by
default, as the API server decodes both.
"""

import ast
import asyncio
import datetime
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import certifi
import pytest
import yarl
from kubernetes.aio import client as aio_client
from kubernetes.aio.client.api_client import ApiClient
from kubernetes.aio.client.configuration import Configuration

import dra_driver
from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.kube import official_loader, server_access
from dra_driver.kube.claim_api import CLAIM_PATH
from dra_driver.kube.kube_api import USER_AGENT, KubeClient, call
from dra_driver.kube.server_access import (
    RotatedToken,
    ServerAccess,
    ServerConfigError,
    StaticAuthorization,
    in_cluster_server,
)
from dra_driver.kube.slice_api import SliceApi, node_event
from tests.support.nodes import inventory_for

ROOT = Path(__file__).resolve().parents[3]
DRIVER = "gpu.dra-driver.dev"
NODE = "node-a"
TOKEN = "secret-token"


def _init_file(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def _binds_names_only(package: str, statement: ast.stmt) -> bool:
    """Whether running `statement` in the package's __init__ does nothing but bind names: a
    docstring, an import of one of its own submodules or of the standard library, a dunder,
    a plain function definition."""
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    if isinstance(statement, ast.ImportFrom):
        if statement.level == 1:
            own = f"{package}.{statement.module}" if statement.module else package
            return importlib.util.find_spec(own) is not None
        return statement.level == 0 and (statement.module or "").split(".")[0] in sys.stdlib_module_names
    if isinstance(statement, ast.Import):
        return all(
            alias.name.split(".")[0] in sys.stdlib_module_names
            or (alias.name.startswith(f"{package}.") and alias.name.count(".") == package.count(".") + 1)
            for alias in statement.names
        )
    if isinstance(statement, ast.Assign):
        targets = [target.id for target in statement.targets if isinstance(target, ast.Name)]
        return bool(targets) and all(t.startswith("__") and t.endswith("__") for t in targets)
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
        defaults = [*statement.args.defaults, *statement.args.kw_defaults]
        return not statement.decorator_list and all(
            default is None or isinstance(default, ast.Constant) for default in defaults
        )
    return False


@pytest.mark.parametrize("package", official_loader._LAZY_PACKAGES)
def test_the_deferred_package_inits_only_bind_names(package: str) -> None:
    """What makes running them late (or never) safe: no other side effect to miss."""
    tree = ast.parse(_init_file(package).read_text(encoding="utf-8"))
    for statement in tree.body:
        assert _binds_names_only(package, statement), f"{package}: {ast.unparse(statement)}"


def _run(program: str, *arguments: str) -> str:
    """What `program` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run(
        [sys.executable, "-c", program, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# Packages (top-level names) the agent's API client must not import.
HEAVY = ("aiohttp", "kubernetes", "pydantic", "dateutil", "urllib3", "requests")

LEAN_AGENT = f"""
import sys
import dra_driver.kube.kube_api
import dra_driver.kube.slice_api
import dra_driver.claims.source
import dra_driver.agent.kube_client

loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r}))
assert not loaded, loaded
assert "dra_driver.kube.official_loader" not in sys.modules
print("ok")
"""

OFFICIAL_LOADER = """
import importlib.metadata, sys, types
from dra_driver.kube import official_loader

unused = ("kubernetes.client", "kubernetes.config", "kubernetes.dynamic", "kubernetes.watch",
          "kubernetes.stream", "kubernetes.leaderelection", "kubernetes.aio.dynamic",
          "kubernetes.aio.watch", "kubernetes.aio.stream", "kubernetes.aio.leaderelection",
          "kubernetes.aio.client.api", "kubernetes.aio.config.incluster_config", "urllib3",
          "requests", "kubernetes_validate")
loaded = sorted(name for name in unused if name in sys.modules)
assert not loaded, loaded
import kubernetes, kubernetes.aio, kubernetes.aio.config
deferred = (kubernetes, kubernetes.aio, kubernetes.aio.config)
assert tuple(package.__name__ for package in deferred) == official_loader._LAZY_PACKAGES
assert all(type(package) is official_loader._PackageBeforeInit for package in deferred)
# What the loader uses came in as submodules, without their packages' __init__.
kube_config = sys.modules["kubernetes.aio.config.kube_config"]
assert official_loader.load_kube_config is kube_config.load_kube_config

# Whatever else is asked of the packages runs their real __init__, once, in place.
assert kubernetes.aio.__version__ == importlib.metadata.version("kubernetes")
assert type(kubernetes.aio) is types.ModuleType and "kubernetes.aio.dynamic" in sys.modules
assert kubernetes.__version__ == importlib.metadata.version("kubernetes")
assert type(kubernetes) is types.ModuleType and sys.modules["kubernetes"] is kubernetes
from kubernetes import client, config, watch
assert client.CoreV1Api and config.load_kube_config and watch.Watch
assert type(kubernetes.aio.config) is not types.ModuleType  # kubernetes.aio's __init__ needs none of it
assert kubernetes.aio.config.load_kube_config is kube_config.load_kube_config
assert type(kubernetes.aio.config) is types.ModuleType
print("ok")
"""

LATE_SUBMODULES = """
import sys, types
import dra_driver.kube.official_loader
from kubernetes import client
from kubernetes.aio import watch
assert client.ResourceV1Api and watch.Watch
import kubernetes
assert type(kubernetes) is not types.ModuleType  # submodules alone do not need the __init__
print("ok")
"""


@pytest.mark.parametrize(
    "program",
    [LEAN_AGENT, OFFICIAL_LOADER, LATE_SUBMODULES],
    ids=["agent-without-the-official-client", "official-loader-lean", "late-submodules"],
)
def test_the_client_loads_lean_and_the_official_one_on_demand(program: str) -> None:
    assert _run(program) == "ok"


AGENT_CLIENTS = f"""
import asyncio, base64, json, os, sys
from pathlib import Path
from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.kube import server_access

directory, ca = Path(sys.argv[1]), Path(sys.argv[2])
(directory / "token").write_text("kubeconfig-token\\n")
kubeconfig = directory / "kubeconfig"
kubeconfig.write_text(f\"\"\"
current-context: c
contexts: [{{{{name: c, context: {{{{cluster: c, user: u}}}}}}}}]
clusters: [{{{{name: c, cluster: {{{{server: "https://10.0.0.1:6443",
  certificate-authority-data: {{base64.b64encode(ca.read_bytes()).decode()}}}}}}}}}}]
users: [{{{{name: u, user: {{{{tokenFile: token}}}}}}}}]
\"\"\")
account = directory / "serviceaccount"
account.mkdir()
(account / "ca.crt").write_bytes(ca.read_bytes())
(account / "token").write_text("sa-token\\n")
os.environ.update(KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
# Its defaults were bound when it was defined: the service account directory is ours here.
server_access.in_cluster_server.__defaults__ = (os.environ, account)

async def clients():
    found = []
    for source in (kubeconfig, None):
        client = await kubernetes_api_client(source)
        server = client.server
        found.append([server.url, await server.credentials.authorization(), server.ca_file])
        await client.close()
    return found

found = asyncio.run(clients())
loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r}))
print(json.dumps({{"found": found, "loaded": loaded}}))
"""


def test_the_agents_client_from_a_kubeconfig_and_in_cluster_without_the_official_one(tmp_path: Path) -> None:
    """From a static kubeconfig (its token in a file) and from the service account, as in a pod:
    the server's URL, the bearer token, and no aiohttp, official client or pydantic loaded."""
    outcome = json.loads(_run(AGENT_CLIENTS, str(tmp_path), certifi.where()))
    assert outcome["found"] == [
        ["https://10.0.0.1:6443", "Bearer kubeconfig-token", None],
        ["https://10.96.0.1:443", "Bearer sa-token", str(tmp_path / "serviceaccount" / "ca.crt")],
    ]
    assert outcome["loaded"] == []


@dataclass(frozen=True)
class Arrived:
    """One request as it came over the socket; header names in lower case."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes


# An answer every caller here accepts: a Node's UID, an empty list.
ANSWER = b'{"metadata":{"uid":"u-1","resourceVersion":"7"},"items":[]}'


def _answer(target: str) -> bytes:
    head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if "watch=true" in target:  # a watch that ends before any event, chunked as the server sends it
        return f"{head}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode()
    return f"{head}Content-Length: {len(ANSWER)}\r\nConnection: close\r\n\r\n".encode() + ANSWER


@asynccontextmanager
async def capture_server() -> AsyncIterator[tuple[str, list[Arrived]]]:
    """A server's URL and the requests it has been sent, one per connection."""
    arrived: list[Arrived] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.removesuffix("\r\n\r\n").split("\r\n")
            method, target, version = request_line.split(" ")
            assert version == "HTTP/1.1", request_line
            headers: dict[str, str] = {}
            for line in lines:
                name, _, value = line.partition(":")
                assert name.lower() not in headers, f"{name} twice"
                headers[name.lower()] = value.strip()
            assert "transfer-encoding" not in headers, "a body of a known length was expected"
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            arrived.append(Arrived(method, target, headers, body))
            writer.write(_answer(target))
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", arrived


# Sends one request to the server at the URL it is given.
Sender = Callable[[str], Awaitable[None]]


def ours(make: Callable[[KubeClient], Awaitable[object]]) -> Sender:
    async def send(url: str) -> None:
        client = KubeClient(ServerAccess(url, credentials=StaticAuthorization(f"Bearer {TOKEN}")))
        try:
            await make(client)
        finally:
            await client.close()

    return send


class _VerbatimUrls:
    """The official client's aiohttp session, handed each URL as already encoded: so the
    request target is the one the generated method built, not aiohttp's re-normalisation of it."""

    def __init__(self, session: Any) -> None:
        self._session = session

    async def request(self, **arguments: Any) -> Any:
        return await self._session.request(**{**arguments, "url": yarl.URL(arguments["url"], encoded=True)})

    async def close(self) -> None:
        await self._session.close()


def theirs(make: Callable[[Any], Awaitable[Any]], *, verbatim: bool = True) -> Sender:
    """`make(api_client)`: a generated `*_without_preload_content` method's call."""

    async def send(url: str) -> None:
        api_client = ApiClient(
            Configuration(host=url, api_key={"BearerToken": TOKEN}, api_key_prefix={"BearerToken": "Bearer"})
        )
        try:
            if verbatim:
                rest = api_client.rest_client
                rest.pool_manager = _VerbatimUrls(rest._create_pool_manager())
            response = await make(api_client)
            await response.read()
        finally:
            await api_client.close()

    return send


async def arrived(*senders: Sender) -> list[Arrived]:
    """The request each of `senders` makes, all sent to one server in turn."""

    async def each() -> list[Arrived]:
        async with capture_server() as (url, requests):
            for count, send in enumerate(senders, start=1):
                await send(url)
                assert len(requests) == count, requests
        return requests

    return await each()


def _slices(method: Callable[[SliceApi], Awaitable[object]]) -> Callable[[KubeClient], Awaitable[object]]:
    return lambda client: method(SliceApi(client, DRIVER, NODE))


async def _watch(api: SliceApi) -> None:
    async for event in api.watch_slices("42"):
        raise AssertionError(f"no event was sent, got {event}")


SLICE = slices_to_api(plan_slices(inventory_for("dgx-h100"), "1.35"), DRIVER, NODE)[0]
SELECTOR = f"spec.driver={DRIVER},spec.nodeName={NODE}"
EVENT = node_event(NODE, "u-1", "GpuLost", "gpu-0 fell off the bus", "Warning")
DELETE_OPTIONS = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "u-1"}}

# Each of our calls, and the generated method that makes the same request.
SAME_REQUESTS: dict[
    str, tuple[Callable[[KubeClient], Awaitable[object]], Callable[[Any], Awaitable[Any]]]
] = {
    "version": (
        _slices(lambda api: api.server_version()),
        lambda c: aio_client.VersionApi(c).get_code_without_preload_content(_request_timeout=30.0),
    ),
    "node": (
        _slices(lambda api: api.node_uid()),
        lambda c: aio_client.CoreV1Api(c).read_node_without_preload_content(NODE, _request_timeout=30.0),
    ),
    "list": (
        _slices(lambda api: api.list_slices()),
        lambda c: aio_client.ResourceV1Api(c).list_resource_slice_without_preload_content(
            field_selector=SELECTOR, _request_timeout=30.0
        ),
    ),
    "watch": (
        _slices(_watch),
        lambda c: aio_client.ResourceV1Api(c).list_resource_slice_without_preload_content(
            field_selector=SELECTOR,
            resource_version="42",
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _request_timeout=330.0,
        ),
    ),
    "create": (
        _slices(lambda api: api.create_slice(SLICE)),
        lambda c: aio_client.ResourceV1Api(c).create_resource_slice_without_preload_content(
            SLICE, _request_timeout=30.0
        ),
    ),
    "replace": (
        _slices(lambda api: api.replace_slice("s-1", SLICE)),
        lambda c: aio_client.ResourceV1Api(c).replace_resource_slice_without_preload_content(
            "s-1", SLICE, _request_timeout=30.0
        ),
    ),
    "delete": (
        _slices(lambda api: api.delete_slice("s-1", uid="u-1")),
        lambda c: aio_client.ResourceV1Api(c).delete_resource_slice_without_preload_content(
            "s-1", body=DELETE_OPTIONS, _request_timeout=30.0
        ),
    ),
    "event": (
        lambda c: call(c, "POST", "/api/v1/namespaces/default/events", body=EVENT, request_timeout=30.0),
        lambda c: aio_client.CoreV1Api(c).create_namespaced_event_without_preload_content(
            "default", EVENT, _request_timeout=30.0
        ),
    ),
    "claim": (
        lambda c: call(
            c, "GET", CLAIM_PATH, path_params={"namespace": "team-a", "name": "claim-1"}, request_timeout=10.0
        ),
        lambda c: aio_client.ResourceV1Api(c).read_namespaced_resource_claim_without_preload_content(
            "claim-1", "team-a", _request_timeout=10.0
        ),
    ),
}

BODIES = {"create": SLICE, "replace": SLICE, "delete": DELETE_OPTIONS, "event": EVENT}
TIMESTAMPS = ("firstTimestamp", "lastTimestamp")
# All that our requests carry: no Accept-Encoding, so no answer comes compressed.
OUR_HEADERS = {"host", "accept", "user-agent", "authorization", "content-type", "content-length"}


def _instant(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize("name", sorted(SAME_REQUESTS))
async def test_our_requests_arrive_as_the_generated_api_methods_send_them(name: str) -> None:
    mine, generated = SAME_REQUESTS[name]
    got, expected = await arrived(ours(mine), theirs(generated))
    assert (got.method, got.target) == (expected.method, expected.target)
    for header in ("host", "accept", "authorization"):
        assert got.headers.get(header) == expected.headers.get(header), header
    assert got.headers["authorization"] == f"Bearer {TOKEN}"
    assert got.headers["user-agent"] == USER_AGENT == f"dra-driver/{dra_driver.__version__}"
    assert set(got.headers) <= OUR_HEADERS, sorted(got.headers)
    body = BODIES.get(name)
    if body is None:
        # The official REST layer names application/json on a request without a body too.
        assert got.body == expected.body == b""
        assert "content-type" not in got.headers and "content-length" not in got.headers
        return
    assert got.headers["content-type"] == expected.headers["content-type"] == "application/json"
    assert json.loads(got.body) == body
    # The generated methods pass bodies through the client's models, which keep every field but
    # not their order; the Event's model rewrites its timestamps, to the same instants.
    sent_by_them = json.loads(expected.body)
    if name == "event":
        for field in TIMESTAMPS:
            assert _instant(sent_by_them.pop(field)) == _instant(body[field]), field
        body = {key: value for key, value in body.items() if key not in TIMESTAMPS}
    assert sent_by_them == body


AWKWARD = ["a b/c", "x%2Fy", "ü-ñ", "?#&=+;", ":@!$'()*,~", "..", ""]


def _path_segments(path: str) -> list[str]:
    """The path's segments as the API server reads them (each one decoded on its own)."""
    return [unquote(segment) for segment in path.split("/")]


@pytest.mark.parametrize("text", AWKWARD)
async def test_path_and_query_values_are_escaped_as_the_client_escapes_them(text: str) -> None:
    def mine(client: KubeClient) -> Awaitable[object]:
        return call(
            client,
            "GET",
            "/api/v1/nodes/{name}",
            path_params={"name": text},
            query=[("labelSelector", text), ("limit", 5), ("watch", False)],
            request_timeout=5,
        )

    def their_list(client: Any) -> Any:
        return aio_client.CoreV1Api(client).list_node_without_preload_content(
            label_selector=text, limit=5, watch=False, _request_timeout=5
        )

    def their_read(client: Any) -> Any:
        return aio_client.CoreV1Api(client).read_node_without_preload_content(text, _request_timeout=5)

    reads = [theirs(their_read), theirs(their_read, verbatim=False)] if text else []  # no empty name
    got, listed, listed_by_aiohttp, *read = await arrived(
        ours(mine), theirs(their_list), theirs(their_list, verbatim=False), *reads
    )
    path, _, query = got.target.partition("?")
    assert _path_segments(path) == ["", "api", "v1", "nodes", text]
    assert parse_qsl(query, keep_blank_values=True) == [
        ("labelSelector", text),
        ("limit", "5"),
        ("watch", "false"),
    ]
    # Exactly as the generated methods escape them...
    assert query == listed.target.partition("?")[2]
    if read:
        assert path == read[0].target
    # ...and the same values as the server decodes what aiohttp makes of their URLs by default
    # (aiohttp resolves a `..` name away, to another path).
    by_aiohttp = listed_by_aiohttp.target.partition("?")[2]
    assert parse_qsl(query, keep_blank_values=True) == parse_qsl(by_aiohttp, keep_blank_values=True)
    if read and text != "..":
        assert _path_segments(path) == _path_segments(read[1].target)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_rotated_token_file_is_read_again_after_a_minute(tmp_path: Path) -> None:
    token, clock = tmp_path / "token", FakeClock()
    token.write_text("one\n")
    credentials = RotatedToken(token, "tokenFile", clock=clock)

    async def authorizations() -> list[str | None]:
        found = [await credentials.authorization()]
        token.write_text("two")
        clock.now += 59.5  # within the minute: not read again
        found.append(await credentials.authorization())
        clock.now += 1.0
        found.append(await credentials.authorization())
        token.unlink()  # a failed read keeps the token it has
        clock.now += 120.0
        found.append(await credentials.authorization())
        token.write_text("three")
        clock.now += 60.0
        found.append(await credentials.authorization())
        return found

    assert await authorizations() == [
        "Bearer one",
        "Bearer one",
        "Bearer two",
        "Bearer two",
        "Bearer three",
    ]


@pytest.mark.parametrize(("content", "reason"), [(None, "No such file"), ("\n", "empty")])
def test_a_token_file_missing_or_empty_at_start_fails_naming_its_field(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    with pytest.raises(ServerConfigError, match=rf"^tokenFile: {token}: {reason}"):
        RotatedToken(token, "tokenFile")


SERVICE_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def _service_account(directory: Path) -> Path:
    (directory / "ca.crt").write_bytes(Path(certifi.where()).read_bytes())
    (directory / "token").write_text("sa-token\n")
    return directory


async def test_in_cluster_the_server_is_the_kubernetes_service_with_the_service_accounts_ca_and_token(
    tmp_path: Path,
) -> None:
    account = _service_account(tmp_path)
    server = in_cluster_server(SERVICE_ENV, account)
    assert (server.url, server.ca_file) == ("https://10.96.0.1:443", str(account / "ca.crt"))
    assert isinstance(server.credentials, RotatedToken)
    assert await server.credentials.authorization() == "Bearer sa-token"
    ipv6 = in_cluster_server({**SERVICE_ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account)
    assert ipv6.url == "https://[fd00::1]:443"


def test_the_default_service_account_directory_is_the_one_kubelet_mounts() -> None:
    environ, account = in_cluster_server.__defaults__ or ()
    assert environ is os.environ and account == server_access.SERVICE_ACCOUNT
    assert Path("/var/run/secrets/kubernetes.io/serviceaccount") == server_access.SERVICE_ACCOUNT


@pytest.mark.parametrize(
    ("environ", "remove", "message"),
    [
        ({}, None, "KUBERNETES_SERVICE_HOST"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None, "KUBERNETES_SERVICE_PORT: not set"),
        (SERVICE_ENV, "ca.crt", r"service account CA: .*/ca\.crt: no such file"),
        (SERVICE_ENV, "token", r"service account token: .*/token: No such file"),
    ],
    ids=["no-host", "no-port", "no-ca", "no-token"],
)
def test_in_cluster_settings_that_are_missing_are_named(
    tmp_path: Path, environ: dict[str, str], remove: str | None, message: str
) -> None:
    account = _service_account(tmp_path)
    if remove is not None:
        (account / remove).unlink()
    with pytest.raises(ServerConfigError, match=message):
        in_cluster_server(environ, account)
