"""Extended resources backed by DRA (KEP-5004): the names under which pods that were written
for the NVIDIA device plugin (`resources.limits: {nvidia.com/gpu: 1}`) get our devices unchanged.

A DeviceClass with `spec.extendedResourceName` tells the scheduler that a container asking for
that extended resource on a node that does not advertise it in `status.allocatable` is asking
for devices of the class: the scheduler then writes a ResourceClaim for the pod itself
(tests/support/extended_claims.py has its exact shape) and kubelet prepares it like any other.

The names are the device plugin's, so that nothing in a pod spec changes:

- whole GPUs: `nvidia.com/gpu`.
- MIG devices: the device plugin's "mixed" MIG strategy advertises one resource per MIG profile,
  `nvidia.com/mig-<profile>` with every '+' of the profile name replaced by '.' (a resource name
  allows letters, digits, '-', '_' and '.' only): `nvidia.com/mig-1g.10gb`,
  `nvidia.com/mig-3g.40gb`, `nvidia.com/mig-1g.10gb.me` for the 1g.10gb+me profile,
  `nvidia.com/mig-1g.24gb.gfx` for a +gfx one. Read in NVIDIA/k8s-device-plugin
  internal/rm/rm.go (AddDefaultResourcesToConfig) at its 2026 head: it names only GPU-instance
  profiles whose compute-instance slices equal the GPU-instance slices (the "1g.10gb" form, not
  "1c.2g.20gb"), which are the only profiles this driver offers. Its "single" strategy (every
  MIG device as `nvidia.com/gpu`) has no equivalent here: a whole-GPU request must never be
  handed a slice.
- fixed-size vGPU partitions have no device-plugin name (HAMi's device plugin asks by
  `nvidia.com/gpumem` instead), so the name is ours: `nvidia.com/vgpu-<size>`, the partition's
  memory as the quantity its device names carry, in lower case: `nvidia.com/vgpu-10gi`,
  `nvidia.com/vgpu-512mi`. Exact, unlike the rounded "gb" of MIG names, so two sizes can never
  share a name.

The field exists in the resource.k8s.io/v1 schema from 1.34, but the DRAExtendedResource gate
that makes the API server keep it and the scheduler honour it is alpha (off) in 1.34 and 1.35,
beta (on) in 1.36 and GA in 1.37: an older cluster would silently drop it and pods asking for
`nvidia.com/gpu` would stay Pending, so the option is refused below 1.36 instead.
"""

import re
from collections.abc import Iterable

import msgspec

from dra_driver.devices.naming import vgpu_size_token
from dra_driver.hardware.catalog import catalog_mig_profile_names

RESOURCE_DOMAIN = "nvidia.com"
GPU_RESOURCE_NAME = f"{RESOURCE_DOMAIN}/gpu"
# The first Kubernetes minor (1.N) whose DRAExtendedResource gate is on by default.
FIRST_MINOR = 36
GATE = "DRAExtendedResource"

# NVIDIA's MIG profile names as mig_names.py makes them: "<n>g.<m>gb" and an optional suffix.
_MIG_PROFILE = re.compile(r"[1-9][0-9]*g\.[1-9][0-9]*gb(\+me|\+gfx|-me|\+me\.all)?")


class ExtendedResources(msgspec.Struct, frozen=True):
    """Which classes name an extended resource: the whole-GPU class always; one class per MIG
    profile and one per vGPU partition size (bytes)."""

    mig_profiles: tuple[str, ...]
    vgpu_partitions: tuple[int, ...] = ()


def mig_profile_problem(profile: str) -> str | None:
    if _MIG_PROFILE.fullmatch(profile):
        return None
    return f"{profile!r} is not a MIG profile name such as 1g.10gb, 3g.40gb or 1g.10gb+me"


def _profile_key(profile: str) -> tuple[int, int, str]:
    """Small to large, as nvidia-smi lists them: by compute slices, then memory, then suffix."""
    compute, _, rest = profile.partition("g.")
    match = re.match(r"[0-9]+", rest)
    memory = int(match[0]) if match else 0
    return (int(compute), memory, rest)


def sorted_profiles(profiles: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(profiles), key=_profile_key))


def catalog_mig_profiles() -> tuple[str, ...]:
    """Every MIG profile of every GPU of the catalog: the default, because DeviceClasses are
    cluster-wide and outlive any node's hardware. A node with another GPU model added later then
    finds its names already served, and a class whose profile no node has selects nothing and
    costs nothing (a pod asking for it stays Pending, as it would with the device plugin)."""
    return sorted_profiles(catalog_mig_profile_names())


def mig_suffix(profile: str) -> str:
    """`mig-1g.10gb`, `mig-1g.10gb.me`: the device plugin's resource name without its domain."""
    return "mig-" + profile.replace("+", ".")


def mig_resource_name(profile: str) -> str:
    return f"{RESOURCE_DOMAIN}/{mig_suffix(profile)}"


def vgpu_suffix(memory_bytes: int) -> str:
    return f"vgpu-{vgpu_size_token(memory_bytes)}"


def vgpu_resource_name(memory_bytes: int) -> str:
    return f"{RESOURCE_DOMAIN}/{vgpu_suffix(memory_bytes)}"


def minor_problem(kubernetes_version: str) -> str | None:
    """Why a target version (checked by kubernetes_version_problem) cannot have extended
    resources, or None when it can."""
    if int(kubernetes_version.partition(".")[2]) >= FIRST_MINOR:
        return None
    return (
        f"needs Kubernetes 1.{FIRST_MINOR} or later, where the {GATE} feature gate is on by default "
        f"(the target is {kubernetes_version}; older API servers drop extendedResourceName)"
    )
