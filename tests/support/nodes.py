"""Simulated nodes and node configurations for tests of the device model."""

from functools import cache

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import GpuEntry, GpuSettings, NodeConfig, VgpuPartitionSize
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.hardware.simulated_nodes import node_profiles, resolve_node_spec, simulated_gpus

GIB = 2**30


@cache
def simulated_node(profile_or_path: str, node_name: str = "node-a") -> tuple[Gpu, ...]:
    """The GPUs as the simulated backend discovers them at boot; plain function calls, so it works
    inside a running event loop too."""
    return simulated_gpus(node_name, resolve_node_spec(profile_or_path))


def all_profiles() -> list[str]:
    return sorted(node_profiles())


def _each_gpu(gpus: tuple[Gpu, ...], settings_of: dict[MigMode, GpuSettings]) -> NodeConfig:
    return NodeConfig(
        gpus=tuple(
            GpuEntry(
                where=f"gpus[{gpu.index}]", index=gpu.index, uuid=None, settings=settings_of[gpu.mig_mode]
            )
            for gpu in gpus
            if gpu.mig_mode in settings_of
        )
    )


def every_gpu(gpus: tuple[Gpu, ...], settings: GpuSettings) -> NodeConfig:
    """A node config that offers every GPU of the node one way."""
    return _each_gpu(gpus, dict.fromkeys(MigMode, settings))


def partition_sizes(gpu: Gpu) -> tuple[VgpuPartitionSize, ...]:
    """A quarter of the GPU (whole GiB) with default cores, and 1 GiB slices with 5 % each."""
    return (VgpuPartitionSize(max(1, gpu.memory_bytes // 4 // GIB) * GIB), VgpuPartitionSize(GIB, cores=5))


def mode_configs(gpus: tuple[Gpu, ...]) -> dict[str, NodeConfig]:
    """Every way a node's GPUs can be offered: the default, dynamic MIG on MIG GPUs, and both vGPU
    modes on the others (MIG GPUs stay static where a mode does not apply to them)."""
    static = GpuSettings(mode="mig-static")
    partitions = {
        gpu.index: GpuSettings(mode="vgpu-partitions", partitions=partition_sizes(gpu))
        for gpu in gpus
        if gpu.mig_mode is not MigMode.ENABLED
    }
    return {
        "default": NodeConfig(),
        "mig-dynamic": _each_gpu(gpus, {MigMode.ENABLED: GpuSettings(mode="mig-dynamic")}),
        "vgpu-capacity": _each_gpu(
            gpus,
            {
                MigMode.UNSUPPORTED: GpuSettings(mode="vgpu-capacity"),
                MigMode.DISABLED: GpuSettings(mode="vgpu-capacity", memory_step=GIB),
                MigMode.ENABLED: static,
            },
        ),
        "vgpu-partitions": NodeConfig(
            gpus=tuple(
                GpuEntry(where=f"gpus[{index}]", index=index, uuid=None, settings=settings)
                for index, settings in partitions.items()
            )
        ),
    }


def inventory_for(profile: str, config: str = "default") -> Inventory:
    """The inventory of a simulated node offered one of the `mode_configs` ways."""
    gpus = simulated_node(profile)
    return node_inventory(gpus, mode_configs(gpus)[config])
