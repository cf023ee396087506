"""What `plan` and `inspect -o layout` read of a cluster: a node's slices and the claims that
hold its devices, through the official client's REST layer (as the slice controller reads)."""

from pathlib import Path

from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.slice_api import SliceApi
from dra_driver.kube.timeouts import TIMEOUTS
from dra_driver.packing.allocator import Allocation, Pool
from dra_driver.packing.published import allocations_from_claims, pool_from_slices

Held = list[tuple[Allocation, str]]


async def read_node(
    kubeconfig: Path | None, driver: str, node: str, slices: bool = True
) -> tuple[Pool, Held]:
    """The node's published pool (empty when `slices` is False) and what allocated claims hold
    of it. Raises StartupError (no client configuration) or ApiError."""
    client = await kubernetes_api_client(kubeconfig)
    try:
        stored = (await SliceApi(client, driver, node).list_slices())[0] if slices else []
        claims = await ClaimApi(client, TIMEOUTS.request).list_everywhere()
    finally:
        await client.close()
    return pool_from_slices(stored, driver), allocations_from_claims(claims, driver, node)
