"""The agent's Kubernetes client: kubeconfig or in-cluster configuration, one connection pool."""

import urllib.parse
import urllib.request
from pathlib import Path

from dra_driver.agent.errors import StartupError
from dra_driver.kube import kube_api
from dra_driver.kube.kubeconfig import load_kubeconfig

# Concurrent claim GETs share one connection pool; kubelet may prepare many pods at once.
API_CONNECTION_POOL_SIZE = 32


async def kubernetes_api_client(kubeconfig: Path | None) -> kube_api.KubeClient:
    configuration = kube_api.Configuration()
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
    try:
        if kubeconfig is not None:
            await load_kubeconfig(kubeconfig, configuration)
        else:
            kube_api.load_incluster_config(client_configuration=configuration)
    except (kube_api.ConfigException, OSError, ValueError) as error:
        raise StartupError(f"{where}: cannot load Kubernetes client configuration: {error}") from error
    configuration.connection_pool_maxsize = API_CONNECTION_POOL_SIZE
    # With trust_env, aiohttp reads ~/.netrc and scans the whole environment for proxies on every
    # request, through two thread hops: a third of each claim GET. The proxy is found once here.
    configuration.proxy = configuration.proxy or environment_proxy(configuration.host)
    configuration.client_session_kwargs = {**(configuration.client_session_kwargs or {}), "trust_env": False}
    try:
        return kube_api.KubeClient(configuration)  # reads the CA and client certificate files
    except OSError as error:  # ssl.SSLError included
        raise StartupError(f"{where}: cannot set up TLS for the Kubernetes API: {error}") from error


def environment_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY name for `url`, unless NO_PROXY exempts its host."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)
