"""What `plan` and `inspect -o layout` read of a cluster: a node's slices and the claims that
hold its devices, through the official client's REST layer (as the slice controller reads)."""

from pathlib import Path

from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.kube.kube_api import call
from dra_driver.packing.allocator import Allocation, Pool
from dra_driver.packing.published import allocations_from_claims, pool_from_slices
from dra_driver.publish.slice_api import REQUEST_TIMEOUT_SECONDS, SliceApi, json_answer

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
Held = list[tuple[Allocation, str]]


async def read_node(
    kubeconfig: Path | None, driver: str, node: str, slices: bool = True
) -> tuple[Pool, Held]:
    """The node's published pool (empty when `slices` is False) and what allocated claims hold
    of it. Raises StartupError (no client configuration) or ApiCallError."""
    client = await kubernetes_api_client(kubeconfig)
    try:
        stored = (await SliceApi(client, driver, node).list_slices())[0] if slices else []
        claims = await json_answer(
            "LIST resourceclaims",
            call(client, "GET", CLAIMS_PATH, request_timeout=REQUEST_TIMEOUT_SECONDS),
            (200,),
        )
    finally:
        await client.close()
    return pool_from_slices(stored, driver), allocations_from_claims(claims.get("items") or [], driver, node)
