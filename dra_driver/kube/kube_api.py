"""The official asyncio Kubernetes client (`kubernetes.aio`), loaded lean, and raw JSON calls.

Two things here keep the agent's resident memory down (issue 8); both stay on the official client.

**The packages' `__init__` run only when needed.** Importing `kubernetes.aio.client` runs
`kubernetes/__init__.py` and `kubernetes/aio/__init__.py` first, as Python always does for
parent packages, and those import every part of the client eagerly: the whole synchronous client
(urllib3, requests, oauthlib, its generated API classes), the dynamic client (which imports
kubernetes-validate and jsonschema when installed), watch, stream, leader election, informers.
The agent uses none of them; they cost about 11 MiB. `kubernetes/aio/config/__init__.py`
imports the kubeconfig loader, and with it `ApiClient` (below). Importing this module first
registers those three packages without running their `__init__`: submodules import as usual,
and the first use of anything else on the package (its `__version__`, say) runs the real
`__init__` right then. The files only import their own submodules and a few standard-library
names, set dunders and define functions (a test checks that), so the packages behave as before,
only later. A package already imported is left alone.

**Calls skip `ApiClient` and the generated API classes.** A `ResourceV1Api` or `VersionApi`
brings in pydantic models for its whole API group and wraps each method in a pydantic validator
(about 6 MiB); `ApiClient` itself imports pydantic, python-dateutil and the models package (about
11 MiB with the kubeconfig loader that imports it). `KubeClient` holds the client's own
`Configuration` and REST layer (`RESTClientObject`: TLS, proxy, retries, the aiohttp connection
pool), and `call` builds the very request the generated `*_without_preload_content` methods hand
that layer (a test compares them byte for byte): path parameters escaped as `ApiClient` escapes
them, its query encoding, its headers and User-Agent, the bearer token from
`Configuration.auth_settings()` (which runs the in-cluster loader's token refresh hook). For
the same reason `dra_driver.kube.kubeconfig`, not the client's loader, reads kubeconfig files
wherever their credentials allow.

Import this module before anything imports `kubernetes`, and the Kubernetes client from here.
"""

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

# Packages whose __init__ imports much the agent never uses.
_LAZY_PACKAGES = ("kubernetes", "kubernetes.aio", "kubernetes.aio.config")
_init_lock = threading.RLock()


class _PackageBeforeInit(types.ModuleType):
    """A package registered in sys.modules whose __init__ has not run yet.

    Only reached for attributes the module does not have: a submodule is imported (as
    `from package import submodule` would do anyway); anything else runs the package's real
    __init__ into this very module, which then is an ordinary module.
    """

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("__"):
            submodule = f"{self.__name__}.{name}"
            try:
                found = importlib.util.find_spec(submodule)
            except (ImportError, ValueError):
                found = None
            if found is not None:
                return importlib.import_module(submodule)
        _run_init(self)
        return getattr(self, name)


def _set_class(module: types.ModuleType, cls: type[types.ModuleType]) -> None:
    module.__class__ = cls


def _run_init(module: types.ModuleType) -> None:
    with _init_lock:
        if not isinstance(module, _PackageBeforeInit):
            return  # another thread got here first
        spec = module.__spec__
        if spec is None or spec.loader is None:  # not from defer_init: cannot happen
            raise ImportError(f"{module.__name__}: no loader to run its __init__ with")
        _set_class(module, types.ModuleType)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            _set_class(module, _PackageBeforeInit)
            raise


def defer_init(name: str) -> None:
    """Registers package `name` without running its __init__; nothing happens if it is imported
    already or not installed. A parent package goes first: finding `name` imports its parent."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _PackageBeforeInit
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


for _package in _LAZY_PACKAGES:
    defer_init(_package)

# Only after the packages above are registered: these imports would otherwise run their __init__.
import kubernetes.aio.client  # noqa: E402
from kubernetes.aio.client.configuration import Configuration  # noqa: E402
from kubernetes.aio.client.rest import RESTClientObject  # noqa: E402
from kubernetes.aio.config.config_exception import ConfigException  # noqa: E402
from kubernetes.aio.config.incluster_config import load_incluster_config  # noqa: E402

from dra_driver.kube.kube_http import HttpAnswer, KeepAliveClient  # noqa: E402

__all__ = [
    "ConfigException",
    "Configuration",
    "KubeClient",
    "call",
    "get",
    "load_incluster_config",
    "request_headers",
]

Query = Iterable[tuple[str, str | int | bool]]

# What ApiClient sends unless told otherwise; the generated code derives both from one version.
USER_AGENT = f"OpenAPI-Generator/{kubernetes.aio.client.__version__}/python"


class KubeClient:
    """The client's configuration and its REST layer, which owns the connection pool; what an
    `ApiClient` holds, without what it imports. Plus the lean pool `get` uses for GETs on the
    pod-startup path, when no proxy is in the way (kube_http)."""

    def __init__(self, configuration: Configuration) -> None:
        self.configuration = configuration
        self.rest_client = RESTClientObject(configuration)
        self.keep_alive = (
            None
            if configuration.proxy
            else KeepAliveClient(
                configuration.host,
                ssl_context=self.rest_client.ssl_context,
                tls_server_name=configuration.tls_server_name,
                max_connections=configuration.connection_pool_maxsize,
            )
        )

    async def open_ahead(self, time_limit: float = 10.0) -> None:
        """The lean pool's first connection, opened now rather than by the first claim GET."""
        if self.keep_alive is not None:
            await self.keep_alive.open_ahead(time_limit)

    async def close(self) -> None:
        await self.rest_client.close()
        if self.keep_alive is not None:
            await self.keep_alive.close()


def _query_text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _filled(configuration: Configuration, path: str, path_params: Mapping[str, str] | None) -> str:
    for key, value in (path_params or {}).items():
        path = path.replace(f"{{{key}}}", quote(value, safe=configuration.safe_chars_for_path_param))
    return path


async def request_headers(configuration: Configuration) -> dict[str, str]:
    """The generated methods' headers, in their order, the bearer token last. Content-Type is
    left to the REST layer, which sets application/json last, as it does for them."""
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
    bearer = (await configuration.auth_settings()).get("BearerToken")
    if bearer is not None and bearer["value"] is not None:
        headers[bearer["key"]] = bearer["value"]
    return headers


async def get(
    client: KubeClient, path: str, *, path_params: Mapping[str, str], request_timeout: float
) -> HttpAnswer:
    """A GET answered whole: through the lean pool where there is one, else as `call` sends it.
    Raises aiohttp.ClientError, OSError, TimeoutError or HttpProtocolError."""
    if client.keep_alive is None:
        response = await call(client, "GET", path, path_params=path_params, request_timeout=request_timeout)
        return HttpAnswer(response.status, await response.read())
    configuration = client.configuration
    return await client.keep_alive.get(
        _filled(configuration, path, path_params), await request_headers(configuration), request_timeout
    )


async def call(
    client: KubeClient,
    method: str,
    path: str,
    *,
    path_params: Mapping[str, str] | None = None,
    query: Query = (),
    body: object = None,
    request_timeout: float,
) -> aiohttp.ClientResponse:
    """One request as the generated API classes make it, answered as the unread aiohttp response.

    `path` may hold `{name}` placeholders, filled from `path_params` and escaped as the client
    escapes them; booleans in `query` are sent as `true`/`false`. Raises what the REST layer
    raises: aiohttp.ClientError or TimeoutError when no answer came.
    """
    configuration = client.configuration
    url = configuration.host + _filled(configuration, path, path_params)
    encoded = "&".join(f"{key}={quote(_query_text(value))}" for key, value in query)
    if encoded:
        url = f"{url}?{encoded}"
    headers = await request_headers(configuration)
    answer = await client.rest_client.request(
        method, url, headers=headers, body=body, post_params=[], _request_timeout=request_timeout
    )
    response: aiohttp.ClientResponse = answer.response
    return response
