"""The agent's Kubernetes client: kubeconfig or in-cluster configuration, one connection pool."""

import urllib.parse
import urllib.request
from pathlib import Path

import msgspec

from dra_driver.agent.errors import StartupError
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.kubeconfig import load_kubeconfig
from dra_driver.kube.server_access import ServerConfigError, in_cluster_server

# Concurrent claim GETs share one connection pool; kubelet may prepare many pods at once.
API_CONNECTION_POOL_SIZE = 32


async def kubernetes_api_client(kubeconfig: Path | None) -> KubeClient:
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
    try:
        server = await load_kubeconfig(kubeconfig) if kubeconfig is not None else in_cluster_server()
    except ServerConfigError as error:
        raise StartupError(f"{where}: cannot load Kubernetes client configuration: {error}") from error
    # The proxy is found once here, not looked up in the environment per request.
    server = msgspec.structs.replace(
        server,
        proxy=server.proxy or environment_proxy(server.url),
        max_connections=API_CONNECTION_POOL_SIZE,
    )
    try:
        return KubeClient(server)  # reads the CA and client certificate files
    except OSError as error:  # ssl.SSLError included
        raise StartupError(f"{where}: cannot set up TLS for the Kubernetes API: {error}") from error
    except ValueError as error:  # a server or proxy URL that is not http(s)
        raise StartupError(f"{where}: cannot reach the Kubernetes API: {error}") from error


def environment_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY name for `url`, unless NO_PROXY exempts its host."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)
