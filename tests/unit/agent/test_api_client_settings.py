"""The agent's Kubernetes client: no per-request environment scan, and still the operator's proxy.

aiohttp with trust_env reads ~/.netrc and walks the environment on every request (two thread
hops), so the agent turns it off and resolves the proxy once, at start, the same way.
"""

import asyncio
from pathlib import Path

import pytest

from dra_driver.agent.kube_client import environment_proxy, kubernetes_api_client
from tests.support.apiserver import ApiServer


@pytest.mark.parametrize(
    ("environment", "url", "expected"),
    [
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://10.96.0.1:443", "http://proxy:3128"),
        ({"https_proxy": "http://proxy:3128"}, "https://10.96.0.1:443", "http://proxy:3128"),
        ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.96.0.1"}, "https://10.96.0.1:443", None),
        ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".svc"}, "https://kubernetes.default.svc", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://10.96.0.1:443", None),
        ({}, "https://10.96.0.1:443", None),
    ],
)
def test_the_proxy_is_the_one_the_environment_names_for_the_api_server(
    environment: dict[str, str], url: str, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(url) == expected


def test_the_client_does_not_trust_the_environment_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ApiServer().start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        server.write_kubeconfig(kubeconfig)
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)

        async def configured() -> tuple[object, object]:
            client = await kubernetes_api_client(kubeconfig)
            try:
                # The REST layer reads the proxy once, when the client is made.
                return client.configuration.client_session_kwargs, client.rest_client.proxy
            finally:
                await client.close()

        session_kwargs, proxy = asyncio.run(configured())
        assert session_kwargs == {"trust_env": False}
        assert proxy == "http://proxy.example:3128"  # the stand-in is plain http
    finally:
        server.stop()
