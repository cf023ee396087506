"""The container edits that make HAMi-core enforce one claim's vGPU shares (pure).

HAMi-core (`libvgpu.so`) sits between CUDA programs and the driver and refuses allocations past
a memory limit and throttles kernels past an SM share. It reads its limits from the environment,
one pair per device the process sees, indexed by CUDA device ordinal; it is loaded into every
process through `/etc/ld.so.preload`, so no image has to know about it. It is not a security
boundary (a program can talk to the driver directly), it keeps cooperative workloads to their
share.

Everything here is data in, data out: the claim's plan turns allocation results into grants
(vgpu_grant.py, where every refusal is); the engine hands them to `vgpu_claim_edits`, the
HAMi-core effect (effects/hami_core.py) makes the host files and directories that come back, and
the edits go in the claim's CDI spec.

The index of a share is the position of its GPU in the order the container's CUDA enumerates
devices. That order is made deterministic, and equal to ours, by sorting shares by PCI bus id
and setting CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's default, fastest first, depends on the GPU
models present). NVML, which HAMi-core and nvidia-smi use for accounting, always enumerates in
bus order, so all three agree. The indices are right for a container that sees exactly the
claim's vGPUs; a container that also sees other GPUs (another claim's, or a whole GPU from
another request) enumerates those in between.

Host side, below the operator's `HamiCore.state_dir`:
- `claims/<claim UID>/ld.so.preload`: the preload list, bind-mounted read-only over the
  container's /etc/ld.so.preload. It sits outside the writable `cache` directory so that no
  container can rewrite what every other container of the claim preloads.
- `claims/<claim UID>/cache/`: the shared cache file, HAMi-core's record of what each process
  of the claim has allocated. Shared by all containers of the claim, because the share is the
  claim's: two containers together may not use more than the claim was granted.
- `vgpulock/`: HAMi-core's lock directory, mounted at /tmp/vgpulock. It is node-wide, not per
  claim, as in HAMi: HAMi-core serialises finding a process's host PID (it compares NVML's
  process lists of the GPU before and after creating a context) across every container that
  uses the GPU, and a lock per claim would let two claims on one GPU mistake each other's
  processes.
"""

import re
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

import msgspec

from dra_driver.claims.edits.cdi import ContainerEdits, Mount
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.opaque_config import OpaqueConfigError, hami_core_environment
from dra_driver.claims.vgpu_grant import VgpuGrant
from dra_driver.devices.node_config import MIB
from dra_driver.hardware.driver_root import READ_ONLY_BIND
from dra_driver.hardware.model import Gpu
from dra_driver.kube.k8s_names import uid_problem

LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"
CACHE_DIR_IN_CONTAINER = "/usr/local/vgpu/cache"
LOCK_DIR_IN_CONTAINER = "/tmp/vgpulock"

# Writable, but nothing in them is ever run or a device node.
READ_WRITE_BIND = ("rw", "nosuid", "nodev", "noexec", "bind")

# Processes of any user in any container of the claim create the cache file and lock files;
# the sticky bit keeps one user from deleting another's lock in the node-wide directory.
CACHE_DIR_MODE = 0o777
LOCK_DIR_MODE = 0o1777
CLAIM_DIR_MODE = 0o755
PRELOAD_FILE_MODE = 0o644

_PCI_BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])")


class HamiCore(msgspec.Struct, frozen=True):
    """Where the node operator installed HAMi-core; without it, limits are advisory only."""

    # Host path of libvgpu.so.
    library: PurePosixPath
    # Host directory for the per-claim directories and the node-wide lock directory.
    state_dir: PurePosixPath

    def __post_init__(self) -> None:
        # CDI host paths are absolute; a relative one would resolve against the runtime's cwd.
        for name, path in (("library", self.library), ("state_dir", self.state_dir)):
            if not path.is_absolute():
                raise ValueError(f"HAMi-core {name} {str(path)!r} is not an absolute path")

    @property
    def lock_dir(self) -> PurePosixPath:
        return self.state_dir / "vgpulock"

    def claim_dir(self, claim_uid: str) -> PurePosixPath:
        return self.state_dir / "claims" / claim_uid


class HostDirectory(msgspec.Struct, frozen=True):
    """A directory the engine creates (parents as needed) and gives exactly `mode`."""

    path: PurePosixPath
    mode: int


class HostFile(msgspec.Struct, frozen=True):
    """A file the engine writes with `content` and gives exactly `mode`."""

    path: PurePosixPath
    content: str
    mode: int


HostEntry = HostDirectory | HostFile


class VgpuClaimEdits(msgspec.Struct, frozen=True):
    """The claim's vGPU edits, and what must exist on the host before a container starts.

    `host_entries` are in creation order and safe to create again. Unprepare removes
    `claim_dir` and nothing else: the lock directory in `host_entries` is the node's.
    """

    edits: ContainerEdits
    host_entries: tuple[HostEntry, ...] = ()
    claim_dir: PurePosixPath | None = None


def _cuda_position(gpu: Gpu) -> tuple[int, ...]:
    """Where CUDA_DEVICE_ORDER=PCI_BUS_ID puts the GPU: by domain, bus, device and function.

    Without a bus id the minor number is the best guess left; it follows the driver's probe
    order, which is bus order on the systems we know.
    """
    match = _PCI_BUS_ID.fullmatch(gpu.pci_bus_id)
    if match is None:
        return (1, gpu.minor)
    return (0, *(int(part, 16) for part in match.groups()))


# What a container of a share under MPS gets, given by the protocol, which owns the GPUs' daemons
# (sharing.vgpu_share_mps_edits): edits/ sits below sharing/ in the claims' layers.
MpsShareEdits = Callable[[VgpuGrant], ContainerEdits]


def vgpu_claim_edits(
    claim_uid: str, shares: Sequence[VgpuGrant], hami_core: HamiCore | None, mps_edits: MpsShareEdits | None
) -> VgpuClaimEdits:
    """The edits that limit a container of the claim to `shares`, as their GPUs' `vgpu.enforcement`
    says (`check_claim_grants` made it one for the claim).

    mps: the share (the claim's only device) reaches its GPU's MPS daemon with its limits as client
    settings, as `mps_edits` (None: the node runs no MPS daemons) says; no HAMi-core.

    Limits are `CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`, the grant rounded down so a container is
    never allowed more than was allocated, and `CUDA_DEVICE_SM_LIMIT_<i>=<percent>`. Without
    HAMi-core they are advisory only (an image that brings its own HAMi-core still obeys them),
    and the shared cache is left out because no mount would share it between containers.
    `shares`: the claim's grants, which its plan checked together (`check_claim_grants`).
    """
    if problem := uid_problem(claim_uid):
        raise ClaimRejected(f"claim UID: {problem}; refusing to name a host directory after it")
    if not shares:
        raise ValueError("a claim without vGPU shares needs no vGPU edits")
    enforcement = shares[0].enforcement
    if enforcement == "mps":
        if mps_edits is None:
            raise ClaimRejected(
                f"device {shares[0].device}: vgpu.enforcement is mps on {shares[0].gpu.label}, but this "
                "node runs no MPS daemons"
            )
        share = shares[0]
        try:
            edits = mps_edits(share)
        except OpaqueConfigError as error:
            raise ClaimRejected(str(error)) from error
        return VgpuClaimEdits(edits=edits)
    if enforcement == "hami-core" and hami_core is None:
        raise ClaimRejected(
            f"device {shares[0].device}: vgpu.enforcement is hami-core on {shares[0].gpu.label}, but the "
            "agent has no --hami-core-library; set it, or choose vgpu.enforcement mps or none"
        )
    ordered = sorted(shares, key=lambda share: _cuda_position(share.gpu))
    env = ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    for index, share in enumerate(ordered):
        env.append(f"CUDA_DEVICE_MEMORY_LIMIT_{index}={share.memory_bytes // MIB}m")
        env.append(f"CUDA_DEVICE_SM_LIMIT_{index}={share.cores}")
    env.extend(f"{name}={value}" for name, value in hami_core_environment(shares[0].config).items())
    if enforcement == "none" or hami_core is None:
        return VgpuClaimEdits(edits=ContainerEdits(env=tuple(env)))

    claim_dir = hami_core.claim_dir(claim_uid)
    cache_dir = claim_dir / "cache"
    preload = claim_dir / "ld.so.preload"
    env.append(f"CUDA_DEVICE_MEMORY_SHARED_CACHE={CACHE_DIR_IN_CONTAINER}/{claim_uid}.cache")
    return VgpuClaimEdits(
        edits=ContainerEdits(
            env=tuple(env),
            mounts=(
                Mount(str(hami_core.library), LIBRARY_IN_CONTAINER, READ_ONLY_BIND),
                Mount(str(preload), PRELOAD_IN_CONTAINER, READ_ONLY_BIND),
                Mount(str(cache_dir), CACHE_DIR_IN_CONTAINER, READ_WRITE_BIND),
                Mount(str(hami_core.lock_dir), LOCK_DIR_IN_CONTAINER, READ_WRITE_BIND),
            ),
        ),
        host_entries=(
            HostDirectory(claim_dir, CLAIM_DIR_MODE),
            HostFile(preload, LIBRARY_IN_CONTAINER + "\n", PRELOAD_FILE_MODE),
            HostDirectory(cache_dir, CACHE_DIR_MODE),
            HostDirectory(hami_core.lock_dir, LOCK_DIR_MODE),
        ),
        claim_dir=claim_dir,
    )


def enforcement_off_message(gpus: Sequence[Gpu]) -> str:
    """What the node logs at start when it offers vGPUs on `gpus` with vgpu.enforcement none."""
    return (
        f"vGPU enforcement is off for {', '.join(gpu.label for gpu in gpus)}: their vgpu.enforcement "
        "is none, so a container gets its memory and SM limits only as advisory environment "
        "variables and nothing stops it from using the whole GPU"
    )
