"""Where the engine reads ResourceClaims from: the API server, or a file for the offline demo."""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yaml

from dra_driver.claims.allocation import ClaimRejected
from dra_driver.kube.k8s_status import status_reason_and_message
from dra_driver.kube.kube_api import KubeClient, get

# Kubelet gives a whole NodePrepareResources call 45 s; one GET must not eat all of it.
CLAIM_GET_TIMEOUT_SECONDS = 10.0
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class ClaimSource(Protocol):
    async def get(self, namespace: str, name: str) -> object:
        """The claim as a JSON object, or ClaimRejected saying why it cannot be had."""
        ...


class ApiServerClaimSource:
    """GETs claims from resource.k8s.io/v1 as raw JSON.

    Raw JSON (rather than the client's generated models) is both faster on the pod-startup path
    and lets the engine check the fields itself with precise error messages.
    """

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def get(self, namespace: str, name: str) -> object:
        try:
            return await get_claim_json(self._client, namespace, name, CLAIM_GET_TIMEOUT_SECONDS)
        except ClaimGetFailed as failed:
            if failed.status == 0:
                raise ClaimRejected(f"{failed.where} failed: {failed.detail}") from failed
            if failed.status == 404:
                raise ClaimRejected(f"{failed.where}: not found (deleted, or never created)") from failed
            if failed.status == 200:
                raise ClaimRejected(f"{failed.where}: the API server sent {failed.detail}") from failed
            raise ClaimRejected(
                f"{failed.where}: API server answered {failed.status}: {failed.detail}"
            ) from failed


class ClaimGetFailed(Exception):
    """A claim GET that gave no claim. `status`: the API server's answer (200 with a body that
    is not JSON), 0 when no answer came; `detail`: why, as one phrase."""

    def __init__(self, where: str, status: int, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.where = where
        self.status = status
        self.detail = detail


async def get_claim_json(client: KubeClient, namespace: str, name: str, timeout_seconds: float) -> object:
    """The claim as the API server stores it, as parsed JSON: the one claim GET of the agent, for
    prepare (the source above) and for the status writer, which words its failures its own way."""
    where = f"GET resourceclaims {namespace}/{name}"
    try:
        response = await get(
            client,
            CLAIM_PATH,
            path_params={"namespace": namespace, "name": name},
            request_timeout=timeout_seconds,
        )
    # ValueError: an answer that is not HTTP (HttpProtocolError), a header that cannot be sent.
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        raise ClaimGetFailed(where, 0, str(error) or type(error).__name__) from error
    if response.status != 200:
        raise ClaimGetFailed(where, response.status, status_reason_and_message(response.body)[1])
    try:
        return json.loads(response.body)
    except ValueError as error:
        raise ClaimGetFailed(where, 200, f"invalid JSON: {error}") from error


def _offline_claim_key(document: object, where: str) -> tuple[str, str]:
    if not isinstance(document, Mapping) or document.get("kind") != "ResourceClaim":
        raise ValueError(f"{where}: expected a ResourceClaim object")
    metadata = document.get("metadata")
    if not isinstance(metadata, Mapping):
        raise ValueError(f"{where}: metadata is missing")
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise ValueError(f"{where}: metadata.namespace and metadata.name must be strings")
    return namespace, name


class OfflineClaimSource:
    """Claims from a YAML file (one document per claim), for running without a cluster."""

    def __init__(self, claims: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        self._claims = claims

    @classmethod
    def from_file(cls, path: Path) -> "OfflineClaimSource":
        """Reads every document of `path`; a malformed one is a ValueError naming its position."""
        try:
            documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"claim file {path}: {error}") from error
        claims = {}
        for position, document in enumerate(documents):
            if document is not None:
                claims[_offline_claim_key(document, f"claim file {path}, document {position}")] = document
        return cls(claims)

    def identities(self) -> list[tuple[str, str, str]]:
        """(namespace, name, uid) of every claim in the file, as kubelet would send them."""
        return [
            (namespace, name, str(claim["metadata"].get("uid", "")))
            for (namespace, name), claim in self._claims.items()
        ]

    async def get(self, namespace: str, name: str) -> object:
        try:
            return self._claims[(namespace, name)]
        except KeyError:
            raise ClaimRejected(f"claim {namespace}/{name} is not in the offline claim file") from None
