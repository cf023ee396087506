"""The benchmark's own API calls, through the agent's HTTP client as the cluster's admin."""

from pathlib import Path
from typing import Any

import msgspec

from dra_driver.kube.calls import json_call
from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.kube.kubeconfig import load_kubeconfig

TIMEOUT = 30.0
CORE = "/api/v1"
RESOURCE = "/apis/resource.k8s.io/v1"


class Api:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    @classmethod
    async def admin(cls, kubeconfig: Path) -> "Api":
        return cls(KubeClient(await load_kubeconfig(kubeconfig)))

    async def close(self) -> None:
        await self.client.close()

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(
            await json_call(
                f"POST {path}", call(self.client, "POST", path, body=body, request_timeout=TIMEOUT)
            )
        )

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when the server has none (404)."""
        answer = await call(self.client, "GET", path, request_timeout=TIMEOUT)
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {answer.status}: {answer.body[:300]!r}")
        decoded: dict[str, Any] = msgspec.json.decode(answer.body)
        return decoded

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(
            await json_call(
                f"PUT {path}", call(self.client, "PUT", path, body=body, request_timeout=TIMEOUT), (200,)
            )
        )

    async def delete(
        self, path: str, query: tuple[tuple[str, str], ...] = (), within: float = TIMEOUT
    ) -> None:
        """Deletes at once (grace 0); an object already gone is fine. The server answers a
        collection's delete only when it has deleted every item (1,000 pods at 500 nodes took
        longer than TIMEOUT on 2 busy cores), hence `within`."""
        answer = await call(
            self.client, "DELETE", path, query=(("gracePeriodSeconds", "0"), *query), request_timeout=within
        )
        if answer.status not in (200, 202, 404):
            raise RuntimeError(f"DELETE {path}: HTTP {answer.status}: {answer.body[:300]!r}")

    async def text(self, url_path: str) -> str:
        answer = await call(self.client, "GET", url_path, request_timeout=TIMEOUT)
        return answer.body.decode()
