"""The official asyncio Kubernetes client (`kubernetes.aio`), loaded lean, and one raw JSON call.

Two things here keep the agent's resident memory down (issue 8); both stay on the official client.

**The packages' `__init__` run only when needed.** Importing `kubernetes.aio.client` runs
`kubernetes/__init__.py` and `kubernetes/aio/__init__.py` first, as Python always does for
parent packages, and those import every part of the client eagerly: the whole synchronous client
(urllib3, requests, oauthlib, its generated API classes), the dynamic client (which imports
kubernetes-validate and jsonschema when installed), watch, stream, leader election, informers.
The agent uses none of them; they cost about 11 MiB. Importing this module first registers
those two packages without running their `__init__`: submodules import as usual, and the first
use of anything else on the package (its `__version__`, say) runs the real `__init__` right
then. Both files only import their own submodules and set version strings (a test checks that),
so the packages behave as before, only later. A package already imported is left alone.

**Calls go through `ApiClient`, not the generated API classes.** A `ResourceV1Api` or
`VersionApi` brings in pydantic models for its whole API group and wraps each of its methods in
a pydantic validator: about 6 MiB. `call` below makes the same request the generated
`*_without_preload_content` methods make (path, query, JSON headers, bearer token, timeout)
through the same `ApiClient.param_serialize` and `call_api`, so TLS, authentication, token
refresh, retries and the connection pool are the client's own.

Import this module before anything imports `kubernetes`, and the Kubernetes client from here.
"""

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

# Packages whose __init__ imports much the agent never uses.
_LAZY_PACKAGES = ("kubernetes", "kubernetes.aio")
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
from kubernetes.aio.client.api_client import ApiClient  # noqa: E402
from kubernetes.aio.client.configuration import Configuration  # noqa: E402
from kubernetes.aio.config import (  # noqa: E402
    ConfigException,
    load_incluster_config,
    load_kube_config,
)

__all__ = [
    "ApiClient",
    "ConfigException",
    "Configuration",
    "call",
    "load_incluster_config",
    "load_kube_config",
]

Query = Iterable[tuple[str, str | int | bool]]


async def call(
    api_client: ApiClient,
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
    escapes them; booleans in `query` are sent as `true`/`false`. Raises what the client raises:
    aiohttp.ClientError or TimeoutError when no answer came.
    """
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = await api_client.param_serialize(
        method=method,
        resource_path=path,
        path_params=dict(path_params) if path_params else {},
        query_params=list(query),
        header_params=headers,
        body=body,
        post_params=[],
        files={},
        auth_settings=["BearerToken"],
        collection_formats={},
    )
    answer = await api_client.call_api(*request, _preload_content=False, _request_timeout=request_timeout)
    response: aiohttp.ClientResponse = answer.response
    return response
