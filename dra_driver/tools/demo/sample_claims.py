"""The demo's sample claims: an allocated ResourceClaim for a device the chosen node really offers.

A claim naming a fixed device (say `gpu-0`) fails on every node that has no such whole GPU, so
the demo looks at what the node offers and, for MIG and vGPU, picks the node configuration that
makes it offer that kind: static MIG instances where the node has them, else dynamic MIG on a
GPU in MIG mode; vGPU capacity mode on a GPU that is not in MIG mode. Everything here is a pure
function of the node's GPUs, so a kind the node cannot offer is refused before anything starts.
"""

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.devices.classes import class_name
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.model import Device, quantity
from dra_driver.devices.node_config import NodeConfig, NodeConfigError
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.hardware.model import Gpu, MigMode

ClaimKind = Literal["gpu", "mig", "vgpu"]
# What `--claim` takes besides a file name.
CLAIM_KINDS: dict[str, ClaimKind] = {"gpu": "gpu", "mig": "mig", "vgpu": "vgpu"}

NAMESPACE = "default"
# Fixed, so that the CDI device IDs a run prints are the same on every machine.
CLAIM_UIDS: dict[ClaimKind, str] = {
    "gpu": "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17",
    "mig": "5b7d2a90-1c3e-4f6a-8b2d-9e0f1a2b3c4d",
    "vgpu": "7c1e9f30-2d4b-4a6c-9e8f-0a1b2c3d4e5f",
}
POD_UID = "8d2e4f61-3b5a-4c7d-a9e8-1f0b2c3d4e5f"
VGPU_SHARE_ID = "2e4f6a8c-0b1d-4e3f-a5c7-9d1b3f5a7c9e"
# A quarter of the GPU: its compute, and (see _quarter) its memory.
VGPU_CORES_PERCENT = 25


class SampleClaimError(OperatorFault, ValueError):
    """The node cannot offer the kind of device asked for; the message says why and what would."""


class SampleClaim(msgspec.Struct, frozen=True):
    claim: dict[str, Any]
    # The node configuration that makes the node offer the device; None: the default one.
    node_config: dict[str, Any] | None


def offered_inventory(gpus: Sequence[Gpu], raw_config: dict[str, Any] | None) -> Inventory | None:
    config = NodeConfig() if raw_config is None else parse_node_config(raw_config, "demo node config")
    try:
        return node_inventory(gpus, config)
    except NodeConfigError:
        return None


def _first(inventory: Inventory | None, kind: ClaimKind) -> Device | None:
    if inventory is None:
        return None
    return next((device for device in inventory.devices if device.type == kind), None)


def candidate_configs(gpus: Sequence[Gpu], kind: ClaimKind) -> list[dict[str, Any] | None]:
    """Node configurations to try, in order: the default first (whole GPUs, static MIG)."""
    if kind == "gpu":
        return [None]
    if kind == "mig":
        in_mig_mode = [gpu for gpu in gpus if gpu.mig_mode == MigMode.ENABLED and not gpu.mig_instances]
        return [None, *({"gpus": [{"index": gpu.index, "mode": "mig-dynamic"}]} for gpu in in_mig_mode)]
    not_mig = [gpu for gpu in gpus if gpu.mig_mode != MigMode.ENABLED]
    return [{"gpus": [{"index": gpu.index, "mode": "vgpu-capacity"}]} for gpu in not_mig]


_WHY_NOT: dict[ClaimKind, str] = {
    "gpu": "no GPU outside MIG mode to hand out whole",
    "mig": "no MIG instances and no GPU in MIG mode for dynamic MIG",
    "vgpu": "no GPU outside MIG mode to share as vGPU",
}
_TRY: dict[ClaimKind, str] = {
    "gpu": "simulated:dgx-h100 or simulated:mixed",
    "mig": "simulated:dgx-h100-mig or simulated:mixed",
    "vgpu": "simulated:l4x8 or simulated:mixed",
}


def _quarter(device: Device) -> int:
    """A quarter of the memory a share may take, in the device's steps, as the scheduler rounds."""
    memory = device.capacity["memory"]
    if memory.request_policy is None:
        return memory.value
    steps = memory.request_policy.valid_range
    return max(steps.minimum, steps.maximum // 4 // steps.step * steps.step)


def default_share(device: Device) -> dict[str, str]:
    """What a vGPU share that asks for nothing in particular consumes: a quarter of the GPU."""
    return {"memory": quantity(_quarter(device)), "cores": str(VGPU_CORES_PERCENT)}


def _result(device: Device, pool: str, driver: str) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "device", "driver": driver, "pool": pool, "device": device.name}
    if device.type == "vgpu":
        result["shareID"] = VGPU_SHARE_ID
        result["consumedCapacity"] = default_share(device)
    return result


def allocated_claim(
    name: str,
    uid: str,
    spec: dict[str, Any],
    results: list[dict[str, Any]],
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it, allocated and reserved for one pod."""
    devices: dict[str, Any] = {"results": results}
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": NAMESPACE, "name": name, "uid": uid},
        "spec": spec,
        "status": {
            "allocation": {"devices": devices},
            "reservedFor": [{"resource": "pods", "name": "demo-pod", "uid": POD_UID}],
        },
    }


def claim_document(kind: ClaimKind, device: Device, pool: str, driver: str) -> dict[str, Any]:
    """The sample claim of `kind`, allocated `device`."""
    request = {"name": "device", "exactly": {"deviceClassName": class_name(kind, driver)}}
    spec = {"devices": {"requests": [request]}}
    return allocated_claim(f"demo-{kind}", CLAIM_UIDS[kind], spec, [_result(device, pool, driver)])


def sample_claim(kind: ClaimKind, gpus: Sequence[Gpu], pool: str, driver: str, node: str) -> SampleClaim:
    """The claim for the first device of `kind` the node offers; `node` names the node in errors.
    Raises SampleClaimError when no configuration makes the node offer one."""
    for raw_config in candidate_configs(gpus, kind):
        if (device := _first(offered_inventory(gpus, raw_config), kind)) is not None:
            return SampleClaim(claim_document(kind, device, pool, driver), raw_config)
    raise SampleClaimError(f"--claim {kind}: {node} has {_WHY_NOT[kind]}; try --hardware {_TRY[kind]}")
