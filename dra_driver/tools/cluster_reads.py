"""What `plan` and `inspect -o layout` read of a cluster: a node's slices and the claims that
hold its devices, through the official client's REST layer (as the slice controller reads)."""

from pathlib import Path

from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.errors import ApiError
from dra_driver.kube.node_api import NodeApi
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


async def read_config_choice(kubeconfig: Path | None, node: str, label_key: str) -> str:
    """Which named config the node's agent offers its GPUs by, as its Node's label says, in
    words. A Node that cannot be read (a user allowed to read slices and claims but not Nodes)
    leaves the config unknown rather than the plan undone. Raises StartupError."""
    client = await kubernetes_api_client(kubeconfig)
    try:
        found, _ = await NodeApi(client, node).list_node()
    except ApiError as error:
        return f"config unknown: {error}"
    finally:
        await client.close()
    if found is None:
        return f"no Node {node}, so no config label"
    labels = (found.get("metadata") or {}).get("labels") or {}
    value = labels.get(label_key)
    if not value:
        return f"the default config (no label {label_key})"
    return f"config {value!r} (label {label_key}={value})"
