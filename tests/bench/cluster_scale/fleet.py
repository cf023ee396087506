"""The fleets the benchmark runs: many 8-GPU nodes in one offering mode, or a mixed fleet, and
what each node publishes (the agent's own planning code, for simulated GPUs named per node).

Single-mode fleets are all DGX H100 (8x H100 80GB), so the modes differ only in how the same
GPUs are offered; the mixed fleet is how operators run them: H100 nodes cut by dynamic MIG,
A100 80GB nodes shared as vGPU partitions, B200 nodes handed out whole.
"""

from collections.abc import Iterable, Sequence

import msgspec
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig, VgpuPartitionSize
from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from tests.bench.cluster_scale.needs import Mode, Need

MIB = 2**20
FLEETS: dict[str, tuple[tuple[str, Mode, float], ...]] = {
    "whole": (("dgx-h100", "gpu", 1.0),),
    "mig-dynamic": (("dgx-h100", "mig-dynamic", 1.0),),
    "vgpu-capacity": (("dgx-h100", "vgpu-capacity", 1.0),),
    "vgpu-partitions": (("dgx-h100", "vgpu-partitions", 1.0),),
    "mixed": (
        ("dgx-h100", "mig-dynamic", 0.4),
        ("dgx-a100-80gb", "vgpu-partitions", 0.3),
        ("b200x8", "gpu", 0.3),
    ),
}


class FleetNode(msgspec.Struct, frozen=True):
    name: str
    profile: str
    mode: Mode
    inventory: Inventory


def node_name(index: int) -> str:
    return f"kwok-gpu-{index:03d}"


def fleet_mode(fleet: str) -> Mode:
    """How needs are asked of the fleet: its one mode, or as written on a mixed fleet."""
    groups = FLEETS[fleet]
    return groups[0][1] if len(groups) == 1 else "native"


def representative_gpu(fleet: str) -> Gpu | None:
    """The GPU needs are translated for (None on a mixed fleet: they are asked as written)."""
    groups = FLEETS[fleet]
    return simulated_gpus("x", resolve_node_spec(groups[0][0]))[0] if len(groups) == 1 else None


def partition_sizes(needs: Iterable[Need]) -> tuple[VgpuPartitionSize, ...]:
    """One partition size per share memory asked for, with the most cores asked at that size."""
    cores: dict[int, int | None] = {}
    for need in needs:
        if need.device_type == "vgpu" and need.memory_bytes:
            memory = -(-need.memory_bytes // MIB) * MIB
            asked = [c for c in (cores.get(memory), need.cores) if c is not None]
            cores[memory] = max(asked) if asked else None
    return tuple(VgpuPartitionSize(memory, cores[memory]) for memory in sorted(cores))


def _settings(
    mode: Mode, order: PackingPolicy, needs: Sequence[Need], mig_profiles: tuple[str, ...]
) -> GpuSettings:
    if mode == "vgpu-partitions":
        return GpuSettings(mode=mode, packing=order, partitions=partition_sizes(needs))
    if mode == "mig-dynamic":
        return GpuSettings(mode=mode, packing=order, mig_profiles=mig_profiles)
    return GpuSettings(mode="gpu" if mode == "native" else mode, packing=order)


def _gpus(name: str, profile: str, mode: Mode) -> list[Gpu]:
    gpus = simulated_gpus(name, resolve_node_spec(profile))
    mig_mode = MigMode.ENABLED if mode == "mig-dynamic" else MigMode.DISABLED
    return [replace(gpu, mig_mode=mig_mode, mig_instances=()) if gpu.mig_profiles else gpu for gpu in gpus]


def fleet_nodes(
    fleet: str, nodes: int, order: PackingPolicy, needs: Sequence[Need], mig_profiles: tuple[str, ...] = ()
) -> list[FleetNode]:
    """`nodes` nodes split among the fleet's groups by share (the last group takes the rest);
    `mig_profiles` is the node config's `mig.profiles` of the mig-dynamic nodes (empty: all)."""
    groups = FLEETS[fleet]
    counts = [round(nodes * share) for _, _, share in groups[:-1]]
    counts.append(nodes - sum(counts))
    found: list[FleetNode] = []
    for (profile, mode, _), count in zip(groups, counts, strict=True):
        for _ in range(count):
            name = node_name(len(found))
            gpus = _gpus(name, profile, mode)
            inventory = node_inventory(gpus, NodeConfig(default=_settings(mode, order, needs, mig_profiles)))
            found.append(FleetNode(name, profile, mode, inventory))
    return found
