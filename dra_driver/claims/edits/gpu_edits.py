"""What a container gets for one GPU or MIG device, as CDI container edits.

Real GPUs need their device node (and for a MIG device the capability nodes of its GPU and
compute instance); the node-wide control nodes and driver libraries come from the node's common
spec. The runtime hook is told to stay away (NVIDIA_VISIBLE_DEVICES=void) because CDI already
did the work. Simulated GPUs have no device nodes, so they get environment variables that
describe exactly what was allocated, which is what tests and the demo check from inside a
container.
"""

from pathlib import Path
from typing import Protocol

import msgspec

from dra_driver.claims.edits.cdi import ContainerEdits, DeviceNode
from dra_driver.claims.edits.mig_caps import (
    CapabilityFileError,
    capability_edits,
    mig_admin_capabilities,
    mig_instance_capabilities,
)
from dra_driver.claims.errors import ClaimRejected
from dra_driver.hardware.model import Gpu, MigInstance


def device_env_prefix(device_name: str) -> str:
    return "DRA_DEVICE_" + device_name.upper().replace("-", "_")


def _describing_env(device_name: str, gpu: Gpu) -> tuple[str, ...]:
    prefix = device_env_prefix(device_name)
    return (f"{prefix}={gpu.uuid}", f"{prefix}_PRODUCT_NAME={gpu.product_name}")


def _describing_mig_env(device_name: str, gpu: Gpu, instance: MigInstance) -> tuple[str, ...]:
    prefix = device_env_prefix(device_name)
    profile = gpu.mig_profile(instance.profile_id)
    return (
        f"{prefix}={instance.uuid}",
        f"{prefix}_PARENT={gpu.uuid}",
        f"{prefix}_PROFILE={profile.name if profile else instance.profile_id}",
        f"{prefix}_PLACEMENT={instance.placement.start}+{instance.placement.size}",
    )


class DeviceEdits(Protocol):
    def gpu(self, device_name: str, gpu: Gpu) -> ContainerEdits: ...

    def mig(self, device_name: str, gpu: Gpu, instance: MigInstance) -> ContainerEdits: ...

    def mig_monitor(self, device_name: str, gpu: Gpu) -> ContainerEdits:
        """Admin access to a MIG device: its GPU, with the right to see every MIG instance on it
        (the `monitor` capability) but not to create or destroy any."""
        ...


class SimulatedEdits:
    def gpu(self, device_name: str, gpu: Gpu) -> ContainerEdits:
        return ContainerEdits(env=_describing_env(device_name, gpu))

    def mig(self, device_name: str, gpu: Gpu, instance: MigInstance) -> ContainerEdits:
        return ContainerEdits(env=_describing_mig_env(device_name, gpu, instance))

    def mig_monitor(self, device_name: str, gpu: Gpu) -> ContainerEdits:
        return self.gpu(device_name, gpu).plus(
            ContainerEdits(env=(f"{device_env_prefix(device_name)}_MIG_MONITOR=true",))
        )


class NvmlEdits(msgspec.Struct, frozen=True):
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/")

    def gpu(self, device_name: str, gpu: Gpu) -> ContainerEdits:
        return ContainerEdits(
            env=("NVIDIA_VISIBLE_DEVICES=void", *_describing_env(device_name, gpu)),
            device_nodes=(DeviceNode.under(self.dev_root, f"/dev/nvidia{gpu.minor}"),),
        )

    def mig(self, device_name: str, gpu: Gpu, instance: MigInstance) -> ContainerEdits:
        try:
            capabilities = mig_instance_capabilities(
                self.proc_root, gpu.minor, instance.gpu_instance_id, instance.compute_instance_id
            )
        except CapabilityFileError as error:
            raise ClaimRejected(f"MIG device {device_name}: {error}") from error
        caps = capability_edits(capabilities, self.dev_root)
        return ContainerEdits(
            env=("NVIDIA_VISIBLE_DEVICES=void", *_describing_mig_env(device_name, gpu, instance)),
            device_nodes=(DeviceNode.under(self.dev_root, f"/dev/nvidia{gpu.minor}"), *caps.device_nodes),
        )

    def mig_monitor(self, device_name: str, gpu: Gpu) -> ContainerEdits:
        try:
            _config, monitor = mig_admin_capabilities(self.proc_root)
        except CapabilityFileError as error:
            raise ClaimRejected(f"MIG device {device_name}: {error}") from error
        return self.gpu(device_name, gpu).plus(capability_edits((monitor,), self.dev_root))
