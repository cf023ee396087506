"""The ResourceClaim calls: the GET of prepare (through the lean pool of the pod-startup path),
the status writer's GET and status PUT, and the cluster-wide list `plan` reads. Each raises
`ApiError` (`kube.calls`); what a failure means for a claim is the caller's to say."""

from dra_driver.base.json_object import JsonObject
from dra_driver.kube.calls import json_call, json_get
from dra_driver.kube.kube_api import KubeClient, call

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class ClaimApi:
    """`timeout`: seconds per call (`TIMEOUTS.claim_get` for prepare, `claim_status` for the
    status writer)."""

    def __init__(self, client: KubeClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    async def get(self, namespace: str, name: str) -> object:
        """The claim as the API server stores it, as parsed JSON of whatever shape it has."""
        return await json_get(
            self._client,
            f"GET resourceclaims {namespace}/{name}",
            CLAIM_PATH,
            {"namespace": namespace, "name": name},
            self._timeout,
        )

    async def replace_status(self, namespace: str, name: str, claim: JsonObject) -> None:
        await json_call(
            f"PUT resourceclaims/status {namespace}/{name}",
            call(
                self._client,
                "PUT",
                CLAIM_PATH + "/status",
                path_params={"namespace": namespace, "name": name},
                body=claim,
                request_timeout=self._timeout,
            ),
            (200,),
        )

    async def list_everywhere(self) -> list[JsonObject]:
        listed = await json_call(
            "LIST resourceclaims",
            call(self._client, "GET", CLAIMS_PATH, request_timeout=self._timeout),
            (200,),
        )
        return list(listed.get("items") or [])
