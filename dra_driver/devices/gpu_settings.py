"""One GPU's settings as the node config gives them, and how messages name a GPU.

Below both the node config (which decodes and plans them) and the modes (devices.modes, which
check and offer them), so that each mode's module can read settings without importing the
planning that reads the modes.
"""

from typing import Literal

import msgspec

from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.model import Gpu

# A mode's name as configured: "auto" or one of devices.modes.registry's modes. A plain string,
# so a new mode is a new module and a registry line, not also a type to extend; the decoder
# accepts only the registry's names (node_config_decode), and planning refuses any other.
Mode = str
# A registered mode's name (never "auto"): what a GPU's plan says it is offered as.
ResolvedMode = str
# What holds a vGPU share to its limits. mps: NVIDIA's MPS, one control daemon per GPU, which
# enforced both the SM share and the memory limit on the H200 (docs/hardware.md); hami-core: the
# preloaded HAMi-core library, which held memory there but not compute; none: the limits are
# only advisory environment variables.
Enforcement = Literal["mps", "hami-core", "none"]
MIB = 2**20


class VgpuPartitionSize(msgspec.Struct, frozen=True):
    memory_bytes: int
    # Percent of the GPU's SMs; None = the partition's share of memory.
    cores: int | None = None


class GpuSettings(msgspec.Struct, frozen=True):
    mode: Mode = "auto"
    # Capacity mode: the granularity of memory requests.
    memory_step: int = MIB
    partitions: tuple[VgpuPartitionSize, ...] = ()
    # Dynamic MIG: profile names to publish; empty = all.
    mig_profiles: tuple[str, ...] = ()
    # Where the scheduler's first fit puts claims that share GPUs (devices.order).
    packing: PackingPolicy = "binpack"
    # vGPU modes: how shares are held to their limits.
    enforcement: Enforcement = "mps"


def describe_gpu(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.product_name}, {gpu.uuid})"
