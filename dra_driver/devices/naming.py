"""Device names, and parsing them back.

A device name is all the scheduler hands back in an allocation, and all that survives a crash
in our records, so every name encodes what it stands for: the GPU (by NVML minor number, stable
across reboots), and for MIG the profile and placement, for vGPU partitions the size and the
slot. Names are DNS labels, as the API requires.
"""

import re

import msgspec

from dra_driver.devices.model import quantity
from dra_driver.hardware.model import Gpu, MigProfile


class WholeGpuName(msgspec.Struct, frozen=True):
    minor: int


class MigName(msgspec.Struct, frozen=True):
    minor: int
    profile_token: str
    start: int


class VgpuPartitionName(msgspec.Struct, frozen=True):
    minor: int
    size_token: str
    slot: int


ParsedName = WholeGpuName | MigName | VgpuPartitionName

_WHOLE = re.compile(r"gpu-(0|[1-9][0-9]*)")
_MIG = re.compile(r"gpu-(0|[1-9][0-9]*)-mig-([0-9a-z][0-9a-z-]*[a-z])-(0|[1-9][0-9]*)")
_VGPU = re.compile(r"gpu-(0|[1-9][0-9]*)-vgpu-([0-9a-z]+)-(0|[1-9][0-9]*)")


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def counter_set_name(gpu: Gpu) -> str:
    """One counter set per GPU; named like the GPU so the link is obvious in `kubectl get`."""
    return f"gpu-{gpu.minor}"


def mig_profile_token(profile_name: str) -> str:
    """'1g.10gb' -> '1g10gb', '1g.10gb+me' -> '1g10gb-me', '1g.24gb-me' -> '1g24gb-no-me'.

    Dots go (not allowed in a label); the '+'/'-' suffix markers stay distinguishable.
    """
    base, plus, extra = profile_name.partition("+")
    if not plus:
        base, minus, extra = profile_name.partition("-")
        return base.replace(".", "") + (f"-no-{extra.replace('.', '')}" if minus else "")
    return f"{base.replace('.', '')}-{extra.replace('.', '')}"


def mig_device_name(gpu: Gpu, profile: MigProfile, start: int) -> str:
    return f"gpu-{gpu.minor}-mig-{mig_profile_token(profile.name)}-{start}"


def vgpu_size_token(memory_bytes: int) -> str:
    """The partition memory as its quantity, lower case for a DNS label: '10gi', '512mi'."""
    return quantity(memory_bytes).lower()


def vgpu_partition_name(gpu: Gpu, memory_bytes: int, slot: int) -> str:
    return f"gpu-{gpu.minor}-vgpu-{vgpu_size_token(memory_bytes)}-{slot}"


def parse_device_name(name: str) -> ParsedName | None:
    """The parts of one of our names; None for a name this driver never produces."""
    if match := _WHOLE.fullmatch(name):
        return WholeGpuName(int(match[1]))
    if match := _MIG.fullmatch(name):
        return MigName(int(match[1]), match[2], int(match[3]))
    if match := _VGPU.fullmatch(name):
        return VgpuPartitionName(int(match[1]), match[2], int(match[3]))
    return None


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sorts 'gpu-2' before 'gpu-10', so slices list devices in the order people read them."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)
