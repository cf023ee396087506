"""What a vGPU share grants: the limits HAMi-core enforces for one allocation result (pure).

The plan computes each grant once (claim_plan.py), so a grant that cannot be given refuses the
claim before any side effect; the container edits (vgpu_edits.py), the record, the claim's status
and the metadata files all take the grant as computed.
"""

import json
from collections.abc import Sequence

import msgspec

from dra_driver.claims.claim_object import AllocatedDevice, Consumed
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.opaque_config import VgpuConfig
from dra_driver.devices.model import Device, quantity
from dra_driver.devices.node_config import MIB, Enforcement
from dra_driver.devices.vgpu import ALL_CORES
from dra_driver.hardware.model import Gpu
from dra_driver.kube.k8s_names import shown


class VgpuGrant(msgspec.Struct, frozen=True):
    """What one allocation result grants of one GPU."""

    device: str
    gpu: Gpu
    memory_bytes: int
    cores: int
    share_id: str | None
    config: VgpuConfig
    # What holds the share to its limits: its GPU's `vgpu.enforcement` in the node config.
    enforcement: Enforcement = "mps"

    def __post_init__(self) -> None:
        # HAMi-core counts whole MiB and reads a limit of 0 as "no limit", so a share under 1 MiB
        # would become the whole GPU; `vgpu_grant` refuses such results before they get here.
        if not MIB <= self.memory_bytes <= self.gpu.memory_bytes:
            raise ValueError(
                f"{self.device}: {self.memory_bytes} bytes is not between 1Mi and the "
                f"{self.gpu.memory_bytes} bytes of {self.gpu.label}"
            )
        if not 1 <= self.cores <= ALL_CORES:
            raise ValueError(f"{self.device}: {self.cores} cores is not between 1 and {ALL_CORES}")


def _memory(consumed: Consumed, path: str, device: Device) -> int:
    limit = device.capacity["memory"].value
    if consumed.amount < MIB:
        raise ClaimRejected(
            f"{path}: {json.dumps(consumed.written)} is less than 1Mi; HAMi-core limits memory in whole "
            "MiB and reads a limit of 0 as no limit"
        )
    if consumed.amount > limit:
        raise ClaimRejected(
            f"{path}: {json.dumps(consumed.written)} is more than the {quantity(limit)} "
            f"of device {device.name}"
        )
    return consumed.amount


def _cores(consumed: Consumed, path: str, device: Device) -> int:
    limit = device.capacity["cores"].value
    if not 1 <= consumed.amount <= limit:
        raise ClaimRejected(
            f"{path}: {json.dumps(consumed.written)} is out of range; expected a percentage from 1 to "
            f"{limit} (the cores of device {device.name})"
        )
    return consumed.amount


def vgpu_grant(
    result: AllocatedDevice, device: Device, gpu: Gpu, config: VgpuConfig, enforcement: Enforcement = "mps"
) -> VgpuGrant:
    """The share that allocation `result` grants: computed once, in the plan (claim_plan.py).

    `device` is the published vGPU device the result names and `gpu` its GPU. A capacity-mode
    result says what it consumed in `consumedCapacity` (decoded with the claim: memory in bytes,
    cores in percent); a capacity it leaves out was consumed whole, as when the cluster lacks
    consumable capacity and the device went to one claim. A partition is always consumed whole.
    Either way the grant must fit the device: a result asking for more is refused rather than
    trimmed, since it means the scheduler and this node disagree about the device.
    """
    if device.type != "vgpu":
        raise ValueError(f"device {device.name} is a {device.type} device, not a vGPU")
    path = f"{result.path}.consumedCapacity"
    for name in result.consumed_names:
        if name not in device.capacity:
            raise ClaimRejected(
                f"{path}: {shown(name)} is not a capacity of device {device.name} "
                f"(it has {', '.join(sorted(device.capacity))})"
            )
    return VgpuGrant(
        device=device.name,
        gpu=gpu,
        memory_bytes=(
            device.capacity["memory"].value
            if result.memory is None
            else _memory(result.memory, f"{path}.memory", device)
        ),
        cores=(
            device.capacity["cores"].value
            if result.cores is None
            else _cores(result.cores, f"{path}.cores", device)
        ),
        share_id=result.share_id,
        config=config,
        enforcement=enforcement,
    )


def check_claim_grants(grants: Sequence[VgpuGrant], other_devices: Sequence[str] = ()) -> None:
    """Refuses the grants of one claim that HAMi-core or MPS cannot express together.

    `other_devices`: the claim's devices of ours that are no vGPU share (admin access aside).
    A share under MPS reaches its GPU's MPS server through the one CUDA_MPS_PIPE_DIRECTORY of the
    container, and a process attached to an MPS server sees only that server's GPU (NVIDIA's MPS
    documentation), so such a share must be the claim's only device."""
    mps = [share for share in grants if share.enforcement == "mps"]
    if mps and (len(grants) > 1 or other_devices):
        others = [share.device for share in grants if share is not mps[0]] + list(other_devices)
        raise ClaimRejected(
            f"device {mps[0].device} is a vGPU share enforced by MPS (vgpu.enforcement: mps on "
            f"{mps[0].gpu.label}), so it must be the claim's only device, but the claim also has "
            f"{', '.join(others)}: a process reaches one MPS server, and sees only that server's GPU; "
            "put the other devices in a claim of their own"
        )
    first_of_gpu: dict[str, VgpuGrant] = {}
    for share in grants:
        if (earlier := first_of_gpu.setdefault(share.gpu.uuid, share)) is not share:
            raise ClaimRejected(
                f"devices {earlier.device} and {share.device} are both shares of {share.gpu.label}; "
                "a claim takes at most one share of a GPU, because HAMi-core sets one limit per GPU "
                "a container sees and the container sees that GPU once; ask for one larger share"
            )
    for share in grants[1:]:
        if share.enforcement != grants[0].enforcement:
            raise ClaimRejected(
                f"devices {grants[0].device} and {share.device} are vGPU shares of GPUs with different "
                f"vgpu.enforcement ({grants[0].enforcement} on {grants[0].gpu.label}, {share.enforcement} on "
                f"{share.gpu.label}); a process is limited one way, so a claim's shares need GPUs "
                "configured alike"
            )
        if share.config != grants[0].config:
            raise ClaimRejected(
                f"devices {grants[0].device} and {share.device} have different VgpuConfigs; "
                "HAMi-core applies one setting to every GPU of a process, so all vGPUs of a claim "
                "need the same VgpuConfig"
            )
