"""The official Kubernetes client's kubeconfig loader, for credentials the agent does not read
itself: an exec plugin or an auth provider (`kube.kubeconfig` sends such a file here).

The loader fills the official client's `Configuration`; the agent's own HTTP client takes the
server, TLS files and proxy from it, and asks the loader for the Authorization header before each
request (`LoaderCredentials`: it runs an exec plugin again once its credential has expired).

Loaded lean: importing `kubernetes.aio.config.kube_config` runs `kubernetes/__init__.py`,
`kubernetes/aio/__init__.py` and `kubernetes/aio/config/__init__.py` first, as Python always does
for parent packages, and those import every part of the client eagerly: the whole synchronous
client (urllib3, requests, oauthlib, its generated API classes), the dynamic client (which
imports kubernetes-validate and jsonschema when installed), watch, stream, leader election,
informers; about 11 MiB the agent never uses. Importing this module first registers those three
packages without running their `__init__`: submodules import as usual, and the first use of
anything else on the package (its `__version__`, say) runs the real `__init__` right then. The
files only import their own submodules and a few standard-library names, set dunders and define
functions (a test checks that), so the packages behave as before, only later. A package already
imported is left alone.
"""

import importlib
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any

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
from kubernetes.aio.client.configuration import Configuration  # noqa: E402
from kubernetes.aio.config.config_exception import ConfigException  # noqa: E402
from kubernetes.aio.config.kube_config import KubeConfigLoader, load_kube_config  # noqa: E402

from dra_driver.kube.server_access import ServerAccess, ServerConfigError  # noqa: E402


class LoaderCredentials:
    """The Authorization header the official loader made. For an exec plugin the loader is asked
    again before each request, and runs the plugin again once the credential it gave has expired
    (its `expirationTimestamp`): the loader itself does that only when it loads, and sets no
    refresh hook on the Configuration for it."""

    def __init__(self, loader: KubeConfigLoader, configuration: Configuration) -> None:
        self._loader, self._configuration = loader, configuration

    async def authorization(self) -> str | None:
        if _uses_exec_plugin(self._loader):
            await self._loader.load_from_exec_plugin()
            token = getattr(self._loader, "token", None)
            if token is not None:
                return str(token)
        bearer = (await self._configuration.auth_settings()).get("BearerToken")
        return None if bearer is None else bearer["value"]


def _uses_exec_plugin(loader: KubeConfigLoader) -> bool:
    return "exec" in loader._user  # the loader's own test for it


async def server_from_client_loader(path: Path) -> ServerAccess:
    """The current context of the kubeconfig at `path`, as the official loader reads it. Raises
    ServerConfigError with the loader's message, or when an exec plugin gave no credential (the
    loader only logs that, and the agent would run unauthenticated)."""
    configuration = Configuration()
    try:
        # persist_config off: the agent never writes refreshed credentials back into the file.
        loader = await load_kube_config(
            config_file=str(path), client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, ValueError) as error:
        raise ServerConfigError(f"the client's kubeconfig loader: {error}") from error
    if (
        _uses_exec_plugin(loader)
        and getattr(loader, "token", None) is None
        and configuration.cert_file is None
    ):
        raise ServerConfigError("exec: the credential plugin gave no token or certificate (see the log)")
    return ServerAccess(
        configuration.host,
        ca_file=configuration.ssl_ca_cert,
        ca_data=configuration.ca_cert_data,
        client_certificate=configuration.cert_file,
        client_key=configuration.key_file,
        verify=configuration.verify_ssl,
        tls_server_name=configuration.tls_server_name,
        proxy=configuration.proxy,
        credentials=LoaderCredentials(loader, configuration),
    )
