"""dra_driver.kube.kube_api: the Kubernetes client loaded without its packages' eager __init__, and raw
calls that are byte for byte the requests the client's generated API classes make."""

import ast
import asyncio
import contextlib
import datetime
import importlib.util
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import certifi
import pytest
from kubernetes.aio import client as aio_client
from kubernetes.aio.client.api_client import ApiClient
from kubernetes.aio.config.incluster_config import InClusterConfigLoader

from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.kube.claim_api import CLAIM_PATH
from dra_driver.kube.kube_api import Configuration, KubeClient, call
from dra_driver.kube.slice_api import SliceApi, node_event
from tests.support.nodes import inventory_for

DRIVER = "gpu.dra-driver.dev"
NODE = "node-a"
DEFERRED_PACKAGES = ("kubernetes", "kubernetes.aio", "kubernetes.aio.config")


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


@pytest.mark.parametrize("package", DEFERRED_PACKAGES)
def test_the_deferred_package_inits_only_bind_names(package: str) -> None:
    """What makes running them late (or never) safe: no other side effect to miss."""
    tree = ast.parse(_init_file(package).read_text(encoding="utf-8"))
    for statement in tree.body:
        assert _binds_names_only(package, statement), f"{package}: {ast.unparse(statement)}"


FRESH_INTERPRETER = """
import importlib.metadata, sys, types
import dra_driver.kube.kube_api
from dra_driver.kube.slice_api import SliceApi, node_event
from tests.support.nodes import inventory_for
from dra_driver.claims.source import ApiServerClaimSource

unused = ("kubernetes.client", "kubernetes.config", "kubernetes.dynamic", "kubernetes.watch",
          "kubernetes.aio.dynamic", "kubernetes.aio.watch", "kubernetes.aio.client.api", "urllib3",
          "requests", "kubernetes_validate", "kubernetes.aio.client.api_client",
          "kubernetes.aio.config.kube_config", "pydantic", "dateutil")
loaded = sorted(name for name in unused if name in sys.modules)
assert not loaded, loaded
import kubernetes, kubernetes.aio, kubernetes.aio.config
deferred = (kubernetes, kubernetes.aio, kubernetes.aio.config)
assert all(type(package) is not types.ModuleType for package in deferred)

# Whatever else is asked of the packages runs their real __init__, once, in place.
assert kubernetes.aio.__version__ == importlib.metadata.version("kubernetes")
assert type(kubernetes.aio) is types.ModuleType and "kubernetes.aio.dynamic" in sys.modules
assert kubernetes.__version__ == importlib.metadata.version("kubernetes")
assert type(kubernetes) is types.ModuleType and sys.modules["kubernetes"] is kubernetes
from kubernetes import client, config, watch
assert client.CoreV1Api and config.load_kube_config and watch.Watch
assert type(kubernetes.aio.config) is not types.ModuleType  # kubernetes.aio's __init__ needs none of it
assert kubernetes.aio.config.load_kube_config and type(kubernetes.aio.config) is types.ModuleType
assert "pydantic" in sys.modules  # the kubeconfig loader's ApiClient
print("ok")
"""

LATE_SUBMODULES = """
import sys, types
import dra_driver.kube.kube_api
from kubernetes import client
from kubernetes.aio import watch
assert client.ResourceV1Api and watch.Watch
import kubernetes
assert type(kubernetes) is not types.ModuleType  # submodules alone do not need the __init__
print("ok")
"""


@pytest.mark.parametrize("program", [FRESH_INTERPRETER, LATE_SUBMODULES], ids=["lean", "late-submodules"])
def test_the_client_loads_lean_and_the_rest_of_it_on_demand(program: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


NODE_CLIENTS = """
import asyncio, base64, os, sys
from pathlib import Path
from dra_driver.agent.kube_client import kubernetes_api_client
from kubernetes.aio.config import incluster_config

directory, ca = Path(sys.argv[1]), Path(sys.argv[2])
(directory / "token").write_text("sa-token")
kubeconfig = directory / "kubeconfig"
kubeconfig.write_text(f\"\"\"
current-context: c
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
clusters: [{{name: c, cluster: {{server: "https://10.0.0.1:6443",
  certificate-authority-data: {base64.b64encode(ca.read_bytes()).decode()}}}}}]
users: [{{name: u, user: {{tokenFile: token}}}}]
\"\"\")
os.environ.update(KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
incluster_config.SERVICE_TOKEN_FILENAME = str(directory / "token")
incluster_config.SERVICE_CERT_FILENAME = str(ca)

async def authorizations():
    found = []
    for source in (kubeconfig, None):
        client = await kubernetes_api_client(source)
        settings = await client.configuration.auth_settings()
        found.append((client.configuration.host, settings["BearerToken"]["value"]))
        await client.close()
    return found

found = asyncio.run(authorizations())
expected = [("https://10.0.0.1:6443", "Bearer sa-token"), ("https://10.96.0.1:443", "bearer sa-token")]
assert found == expected, found
unused = ("pydantic", "dateutil", "kubernetes.aio.client.api_client", "kubernetes.aio.config.kube_config")
loaded = sorted(name for name in unused if name in sys.modules)
assert not loaded, loaded
print("ok")
"""


def test_the_agents_client_leaves_pydantic_and_dateutil_out(tmp_path: Path) -> None:
    """From a static kubeconfig and from the service account, as in a cluster."""
    done = subprocess.run(
        [sys.executable, "-c", NODE_CLIENTS, str(tmp_path), certifi.where()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


class Recorded(Exception):
    """Raised where a caller reads the answer: only the request counts."""


class _Unread:
    status, reason = 200, "OK"

    async def read(self) -> bytes:
        raise Recorded

    @property
    def content(self) -> object:
        raise Recorded

    def release(self) -> None:
        pass


class Wire:
    """Stands in for the aiohttp session under the client's REST layer: records every request as
    aiohttp is asked to send it (method, URL, headers in order, body text, timeout)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def request(self, **arguments: Any) -> _Unread:
        self.requests.append(arguments)
        return _Unread()

    async def close(self) -> None:
        pass


def configuration() -> Any:
    return Configuration(
        host="https://apiserver.example:6443",
        api_key={"BearerToken": "secret-token"},
        api_key_prefix={"BearerToken": "Bearer"},
    )


def sent(make: Callable[[Any], Awaitable[object]], client: Any) -> list[dict[str, Any]]:
    """What `make(client)` puts on the wire; `client` is ours or the generated code's ApiClient."""
    wire = Wire()
    client.rest_client.pool_manager = wire
    asyncio.run(_swallow(make(client)))
    return wire.requests


async def _swallow(request: Awaitable[object]) -> None:
    with contextlib.suppress(Recorded):
        await request


SLICE = slices_to_api(plan_slices(inventory_for("dgx-h100"), "1.35"), DRIVER, NODE)[0]
SELECTOR = f"spec.driver={DRIVER},spec.nodeName={NODE}"
EVENT = node_event(NODE, "u-1", "GpuLost", "gpu-0 fell off the bus", "Warning")
DELETE_OPTIONS = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "u-1"}}


def ours(method: Callable[[SliceApi], Awaitable[object]]) -> Callable[[Any], Awaitable[object]]:
    return lambda client: method(SliceApi(client, DRIVER, NODE))


def _watch(api: SliceApi) -> Awaitable[object]:
    async def first() -> object:
        async for event in api.watch_slices("42"):
            return event
        return None

    return first()


# Each of our calls, and the generated method that makes the same request.
SAME_REQUESTS: dict[str, tuple[Callable[[Any], Awaitable[object]], Callable[[Any], Awaitable[object]]]] = {
    "version": (
        ours(lambda api: api.server_version()),
        lambda c: aio_client.VersionApi(c).get_code_without_preload_content(_request_timeout=30.0),
    ),
    "node": (
        ours(lambda api: api.node_uid()),
        lambda c: aio_client.CoreV1Api(c).read_node_without_preload_content(NODE, _request_timeout=30.0),
    ),
    "list": (
        ours(lambda api: api.list_slices()),
        lambda c: aio_client.ResourceV1Api(c).list_resource_slice_without_preload_content(
            field_selector=SELECTOR, _request_timeout=30.0
        ),
    ),
    "watch": (
        ours(_watch),
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
        ours(lambda api: api.create_slice(SLICE)),
        lambda c: aio_client.ResourceV1Api(c).create_resource_slice_without_preload_content(
            SLICE, _request_timeout=30.0
        ),
    ),
    "replace": (
        ours(lambda api: api.replace_slice("s-1", SLICE)),
        lambda c: aio_client.ResourceV1Api(c).replace_resource_slice_without_preload_content(
            "s-1", SLICE, _request_timeout=30.0
        ),
    ),
    "delete": (
        ours(lambda api: api.delete_slice("s-1", uid="u-1")),
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


def _comparable(name: str, request: dict[str, Any]) -> dict[str, Any]:
    """Headers compare in order. Bodies compare as objects: the generated methods pass them
    through the client's models, which keep every field but not their order (the Event's model
    would also rewrite its timestamps; our events never went through it)."""
    comparable = {**request, "headers": list(request["headers"].items())}
    if "data" in comparable:
        comparable["data"] = None if name == "event" else json.loads(comparable["data"])
    return comparable


@pytest.mark.parametrize("name", sorted(SAME_REQUESTS))
def test_raw_calls_make_the_requests_the_generated_api_classes_make(name: str) -> None:
    mine, generated = SAME_REQUESTS[name]
    ours_sent = sent(mine, KubeClient(configuration()))
    theirs_sent = sent(generated, ApiClient(configuration()))
    assert len(ours_sent) == 1
    assert [_comparable(name, request) for request in ours_sent] == [
        _comparable(name, request) for request in theirs_sent
    ]
    assert ours_sent[0]["headers"]["authorization"] == "Bearer secret-token"
    body = BODIES.get(name)
    assert ours_sent[0].get("data") == (None if body is None else json.dumps(body))


AWKWARD = ["a b/c", "x%2Fy", "ü-ñ", "?#&=+;", ":@!$'()*,~", "..", ""]


@pytest.mark.parametrize("text", AWKWARD)
def test_path_and_query_values_are_escaped_as_the_client_escapes_them(text: str) -> None:
    def mine(client: Any) -> Awaitable[object]:
        return call(
            client,
            "GET",
            "/api/v1/nodes/{name}",
            path_params={"name": text},
            query=[("labelSelector", text), ("limit", 5), ("watch", False)],
            request_timeout=1,
        )

    def theirs(client: Any) -> Any:
        return aio_client.CoreV1Api(client).list_node_without_preload_content(
            label_selector=text, limit=5, watch=False, _request_timeout=1
        )

    def their_read(client: Any) -> Any:
        return aio_client.CoreV1Api(client).read_node_without_preload_content(text, _request_timeout=1)

    url = sent(mine, KubeClient(configuration()))[0]["url"]
    path, _, query = url.partition("?")
    if text:  # the generated method refuses an empty name
        assert path == sent(their_read, ApiClient(configuration()))[0]["url"]
    assert query == sent(theirs, ApiClient(configuration()))[0]["url"].partition("?")[2]


def test_the_bearer_token_comes_through_the_refresh_hook_of_the_in_cluster_loader(tmp_path: Path) -> None:
    """The service account token is rotated on disk; the loader re-reads it through the hook that
    Configuration.auth_settings() runs before each request."""
    token = tmp_path / "token"
    token.write_text("one")
    loader = InClusterConfigLoader(
        token_filename=str(token),
        cert_filename=certifi.where(),
        environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    loader._token_refresh_period = datetime.timedelta(0)  # every token expires at once
    settings = Configuration()
    loader.load_and_set(settings)
    client = KubeClient(settings)

    async def two_calls() -> None:
        await _swallow(call(client, "GET", "/version/", request_timeout=1))
        token.write_text("two")
        await _swallow(call(client, "GET", "/version/", request_timeout=1))

    wire = Wire()
    client.rest_client.pool_manager = wire
    asyncio.run(two_calls())
    assert [request["headers"]["authorization"] for request in wire.requests] == ["bearer one", "bearer two"]
