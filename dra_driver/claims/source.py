"""Where the engine reads ResourceClaims from: the API server, or a file for the offline demo."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from dra_driver.base.bounded_yaml import yaml_problem
from dra_driver.claims.errors import ClaimRejected
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.errors import ApiError
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.timeouts import TIMEOUTS


class ClaimSource(Protocol):
    async def get(self, namespace: str, name: str) -> object:
        """The claim as a JSON object, or ClaimRejected saying why it cannot be had."""
        ...


class ApiServerClaimSource:
    """Claims from resource.k8s.io/v1 as raw JSON (`ClaimApi`); this part only words why a claim
    could not be had, as the reason kubelet shows for a pod that cannot start.

    Raw JSON (rather than the client's generated models) is both faster on the pod-startup path
    and lets the engine check the fields itself with precise error messages.
    """

    def __init__(self, client: KubeClient) -> None:
        self._api = ClaimApi(client, TIMEOUTS.claim_get)

    async def get(self, namespace: str, name: str) -> object:
        try:
            return await self._api.get(namespace, name)
        except ApiError as failed:
            raise ClaimRejected(_why(failed)) from failed


def _why(failed: ApiError) -> str:
    if failed.no_answer:
        return f"{failed.call} failed: {failed.message}"
    if failed.not_found:
        return f"{failed.call}: not found (deleted, or never created)"
    if failed.status == 200:
        return f"{failed.call}: the API server sent {failed.message}"
    return f"{failed.call}: API server answered {failed.status}: {failed.message}"


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
        except OSError as error:
            raise ValueError(f"claim file {path}: cannot read it: {error.strerror or error}") from error
        except yaml.YAMLError as error:
            raise ValueError(f"claim file {path}: not valid YAML: {yaml_problem(error)}") from error
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
