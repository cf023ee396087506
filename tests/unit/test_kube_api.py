"""dra_driver.kube_api: the Kubernetes client loaded without its packages' eager __init__, and raw
calls that are byte for byte the requests the client's generated API classes make."""

import ast
import asyncio
import contextlib
import importlib.util
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as aio_client

from dra_driver.claims.source import CLAIM_PATH
from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.kube_api import ApiClient, Configuration, call
from dra_driver.publish.slice_api import SliceApi, node_event
from tests.support.nodes import inventory_for

DRIVER = "gpu.dra-driver.dev"
NODE = "node-a"


def _init_file(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


@pytest.mark.parametrize("package", ["kubernetes", "kubernetes.aio"])
def test_the_deferred_package_inits_only_import_their_submodules_and_set_dunders(package: str) -> None:
    """What makes running them late (or never) safe: no other side effect to miss."""
    tree = ast.parse(_init_file(package).read_text(encoding="utf-8"))
    for statement in tree.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        if isinstance(statement, ast.ImportFrom):
            assert statement.level == 1 and statement.module is None, ast.unparse(statement)
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                assert alias.name.startswith(f"{package}."), ast.unparse(statement)
                assert alias.name.count(".") == package.count(".") + 1, ast.unparse(statement)
        elif isinstance(statement, ast.Assign):
            targets = [target.id for target in statement.targets if isinstance(target, ast.Name)]
            assert targets and all(t.startswith("__") and t.endswith("__") for t in targets), ast.unparse(
                statement
            )
        else:
            raise AssertionError(f"{package}/__init__.py does more than import: {ast.unparse(statement)}")


FRESH_INTERPRETER = """
import importlib.metadata, sys, types
import dra_driver.kube_api
from dra_driver.publish.slice_api import SliceApi, node_event
from tests.support.nodes import inventory_for
from dra_driver.claims.source import ApiServerClaimSource

unused = ("kubernetes.client", "kubernetes.config", "kubernetes.dynamic", "kubernetes.watch",
          "kubernetes.aio.dynamic", "kubernetes.aio.watch", "kubernetes.aio.client.api", "urllib3",
          "requests", "kubernetes_validate")
loaded = sorted(name for name in unused if name in sys.modules)
assert not loaded, loaded
import kubernetes, kubernetes.aio
assert type(kubernetes) is not types.ModuleType and type(kubernetes.aio) is not types.ModuleType

# Whatever else is asked of the packages runs their real __init__, once, in place.
assert kubernetes.aio.__version__ == importlib.metadata.version("kubernetes")
assert type(kubernetes.aio) is types.ModuleType and "kubernetes.aio.dynamic" in sys.modules
assert kubernetes.__version__ == importlib.metadata.version("kubernetes")
assert type(kubernetes) is types.ModuleType and sys.modules["kubernetes"] is kubernetes
from kubernetes import client, config, watch
assert client.CoreV1Api and config.load_kube_config and watch.Watch
assert kubernetes.aio.client.ApiClient is dra_driver.kube_api.ApiClient
print("ok")
"""

LATE_SUBMODULES = """
import sys, types
import dra_driver.kube_api
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


class Recorder:
    """Stands in for the client's REST layer: records each request the ApiClient makes."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def request(self, method: str, url: str, **arguments: Any) -> Any:
        self.requests.append({"method": method, "url": url, **arguments})

        class Answer:
            response = None

        return Answer()


def recording_client() -> tuple[Any, Recorder]:
    configuration = Configuration(
        host="https://apiserver.example:6443",
        api_key={"BearerToken": "secret-token"},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    api_client = ApiClient(configuration)
    recorder = Recorder()
    api_client.rest_client = recorder
    return api_client, recorder


def recorded(make: Callable[[Any], Awaitable[object]]) -> list[dict[str, Any]]:
    api_client, recorder = recording_client()
    asyncio.run(_swallow(make(api_client)))
    return recorder.requests


async def _swallow(request: Awaitable[object]) -> None:
    # The raw API reads the recorder's empty answer and fails; only the request counts.
    with contextlib.suppress(AttributeError):
        await request


SLICE = slices_to_api(plan_slices(inventory_for("dgx-h100"), "1.35"), DRIVER, NODE)[0]
SELECTOR = f"spec.driver={DRIVER},spec.nodeName={NODE}"
EVENT = node_event(NODE, "u-1", "GpuLost", "gpu-0 fell off the bus", "Warning")
DELETE_OPTIONS = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "u-1"}}


def ours(method: Callable[[SliceApi], Awaitable[object]]) -> Callable[[Any], Awaitable[object]]:
    return lambda api_client: method(SliceApi(api_client, DRIVER, NODE))


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


def _comparable(name: str, request: dict[str, Any]) -> dict[str, Any]:
    """Content-Type is only ever set by us when there is a body; the REST layer sets the same
    value itself when it is missing, before sending. Bodies compare as objects: the generated
    methods pass them through the client's models, which keep every field but not their order
    (the Event's model would also rewrite its timestamps; our events never went through it)."""
    headers = dict(request["headers"])
    headers.setdefault("Content-Type", "application/json")
    comparable = {**request, "headers": headers}
    if name == "event":
        del comparable["body"]
    return comparable


@pytest.mark.parametrize("name", sorted(SAME_REQUESTS))
def test_raw_calls_make_the_requests_the_generated_api_classes_make(name: str) -> None:
    mine, generated = SAME_REQUESTS[name]
    ours_sent, theirs_sent = recorded(mine), recorded(generated)
    assert len(ours_sent) == 1
    assert [_comparable(name, request) for request in ours_sent] == [
        _comparable(name, request) for request in theirs_sent
    ]
    assert ours_sent[0]["headers"]["authorization"] == "Bearer secret-token"
    if name == "event":
        assert ours_sent[0]["body"] == EVENT


def test_names_in_paths_are_escaped_as_the_client_escapes_them() -> None:
    sent = recorded(
        lambda c: call(c, "GET", "/api/v1/nodes/{name}", path_params={"name": "a b/c"}, request_timeout=1)
    )
    assert sent[0]["url"] == "https://apiserver.example:6443/api/v1/nodes/a%20b%2Fc"
