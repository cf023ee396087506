"""How the processes of one claim share its devices, as a plan: data in, data out, nothing run.

From each allocated device's effective `Sharing` config this computes what prepare must do (set
a whole GPU's time slice, start one MPS control daemon for the claim), what every container of
the claim must get for MPS (CDI container edits), and what unprepare must undo. The plan is
pure, so prepare can record it before any side effect, and unprepare and crash rollback can undo
from the record alone: `hardware/time_slicing.py` and `claims/sharing/mps.py` carry it out.

Facts the plan relies on (sources in the comments where they are used): `nvidia-smi
compute-policy` sets the time slice of a whole GPU, so MIG devices and vGPUs (which share their
GPU with other claims) keep theirs; an MPS server serves the devices in its CUDA_VISIBLE_DEVICES,
and a process that reaches the server through CUDA_MPS_PIPE_DIRECTORY sees only those devices,
numbered in that order.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from dra_driver.claims.edits.cdi import ContainerEdits, Mount
from dra_driver.claims.identity import InvalidClaimIdentity
from dra_driver.claims.opaque_config import MpsSettings, OpaqueConfigError, Sharing, TimeSlicingSettings
from dra_driver.devices.model import DeviceType
from dra_driver.devices.naming import natural_key
from dra_driver.hardware.model import TimeSliceSetting
from dra_driver.kube.k8s_names import uid_problem

# MPS's own default pipe directory: images that hard-code it keep working.
CONTAINER_PIPE_DIRECTORY = "/tmp/nvidia-mps"
# MPS clients and their server also meet in shared memory files under /dev/shm (a fixed path), so
# the server and every container of the claim get the claim's directory there. NVIDIA's DRA driver
# does the same with a per-daemon tmpfs.
CONTAINER_SHM_DIRECTORY = "/dev/shm"
_READ_WRITE_BIND = ("rw", "nosuid", "nodev", "bind")
MIB = 1024**2


class SharedDevice(msgspec.Struct, frozen=True):
    """One allocated device of a claim as sharing sees it: which hardware, and the sharing its
    effective config asks for. `mig_uuid` is set exactly for MIG devices."""

    name: str
    type: DeviceType
    gpu_uuid: str
    sharing: Sharing
    mig_uuid: str | None = None

    def __post_init__(self) -> None:
        if (self.type == "mig") != (self.mig_uuid is not None):
            raise ValueError(f"device {self.name}: a MIG UUID is given for MIG devices, and only for them")

    @property
    def uuid(self) -> str:
        """What CUDA_VISIBLE_DEVICES names this device by."""
        return self.mig_uuid or self.gpu_uuid


class MpsDirectories(msgspec.Struct, frozen=True):
    """Where the MPS daemon of one claim keeps its pipes, logs and shared memory.

    The claim UID comes from kubelet and is checked on construction, so no value of this type
    can name a path outside `runtime_dir`. `runtime_dir` belongs on tmpfs (/run): MPS state
    dies with a reboot, and shared memory should be memory.
    """

    runtime_dir: Path
    claim_uid: str

    def __post_init__(self) -> None:
        if problem := uid_problem(self.claim_uid):
            raise InvalidClaimIdentity(f"MPS directory of a claim: uid: {problem}")

    @property
    def root(self) -> Path:
        return self.runtime_dir / self.claim_uid

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def shm(self) -> Path:
        return self.root / "shm"


class PinnedMemoryLimit(msgspec.Struct, frozen=True):
    """The most device memory one MPS client may allocate on one device, in whole MiB: MPS takes
    "<n>M" (MPS documentation), and NVIDIA's DRA driver also rounds bytes down to MiB for it."""

    device_index: int
    device_uuid: str
    mebibytes: int


class MpsDaemonSpec(msgspec.Struct, frozen=True):
    """The MPS control daemon of one claim: it serves `device_uuids`, and clients see those
    devices as 0, 1, ... in that order, which is also what a device index in the config means."""

    directories: MpsDirectories
    device_uuids: tuple[str, ...]
    active_thread_percentage: int | None = None
    pinned_memory_limits: tuple[PinnedMemoryLimit, ...] = ()

    def daemon_environment(self) -> dict[str, str]:
        """What nvidia-cuda-mps-control needs, both to start the daemon and to talk to it."""
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(self.device_uuids),
            "CUDA_MPS_PIPE_DIRECTORY": str(self.directories.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.directories.log),
        }

    def control_commands(self) -> tuple[str, ...]:
        """The daemon's defaults, as commands for its control interface (MPS documentation: "set_default_
        active_thread_percentage <percentage>", "set_default_device_pinned_mem_limit <dev> <value>" with
        an integer and a G or M qualifier). Devices are named by UUID, as NVIDIA's DRA driver does: an
        index would depend on how the daemon renumbers the devices in its CUDA_VISIBLE_DEVICES."""
        commands = []
        if self.active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        commands.extend(
            f"set_default_device_pinned_mem_limit {limit.device_uuid} {limit.mebibytes}M"
            for limit in self.pinned_memory_limits
        )
        return tuple(commands)

    def container_edits(self) -> ContainerEdits:
        """What every container of the claim needs to reach the daemon's server.

        The limits are also exported to the clients: a client's own setting can only tighten the
        daemon's (MPS documentation), so they change nothing there, but they make the limits
        visible inside the container. CUDA_MPS_PINNED_DEVICE_MEM_LIMIT has the documented form
        "<device>=<limit>,...", with devices numbered as the clients see them.
        """
        env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIRECTORY}"]
        if self.active_thread_percentage is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={self.active_thread_percentage}")
        if self.pinned_memory_limits:
            limits = ",".join(
                f"{limit.device_index}={limit.mebibytes}M" for limit in self.pinned_memory_limits
            )
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits}")
        return ContainerEdits(
            env=tuple(env),
            mounts=(
                Mount(str(self.directories.pipe), CONTAINER_PIPE_DIRECTORY, _READ_WRITE_BIND),
                Mount(str(self.directories.shm), CONTAINER_SHM_DIRECTORY, _READ_WRITE_BIND),
            ),
        )


_GPU_UUID_PREFIX = "GPU-"


def gpu_daemon_key(gpu_uuid: str) -> str:
    """What names the MPS control daemon of a GPU's vGPU shares: the UUID part of the GPU's UUID.

    It has the form of a claim UID, so the GPU's daemon lives where a claim's would (directories
    under the MPS runtime directory, a pod `mps-<key>`) and the daemon runners, the pod spec and
    the admission policy that allows the agent those pods serve it unchanged; a GPU UUID and a
    claim UID never coincide. Raises OpaqueConfigError for a GPU UUID of another form."""
    key = gpu_uuid.removeprefix(_GPU_UUID_PREFIX).lower()
    if not gpu_uuid.startswith(_GPU_UUID_PREFIX) or uid_problem(key):
        raise OpaqueConfigError(
            f"GPU {gpu_uuid}: vGPU shares under MPS need a GPU UUID of the form GPU-<UUID> to name the "
            "GPU's MPS daemon by; use vgpu.enforcement hami-core or none for this GPU"
        )
    return key


def gpu_daemon_spec(runtime_dir: Path, gpu_uuid: str) -> MpsDaemonSpec:
    """The MPS control daemon every vGPU share of one GPU goes through. It sets no defaults:
    the shares differ, so each share's limits go to its own clients (`vgpu_share_mps_edits`)."""
    return MpsDaemonSpec(MpsDirectories(runtime_dir, gpu_daemon_key(gpu_uuid)), (gpu_uuid,))


def vgpu_share_mps_edits(runtime_dir: Path, gpu_uuid: str, cores: int, memory_bytes: int) -> ContainerEdits:
    """What a container of a claim with one vGPU share under MPS gets: the GPU daemon's pipe and
    shared memory directories, and the share's limits as client settings (MPS documentation:
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, read by each client
    when it starts). The memory limit is the grant rounded down to whole MiB, so never above
    it; the device index is 0, since a client of the GPU's server sees that GPU alone."""
    spec = MpsDaemonSpec(
        directories=MpsDirectories(runtime_dir, gpu_daemon_key(gpu_uuid)),
        device_uuids=(gpu_uuid,),
        active_thread_percentage=cores,
        pinned_memory_limits=(PinnedMemoryLimit(0, gpu_uuid, memory_bytes // MIB),),
    )
    return spec.container_edits()


class RestorePlan(msgspec.Struct, frozen=True):
    """What unprepare (or the rollback of a half-prepared claim) undoes. Every step is idempotent.

    A changed time slice goes back to Default, not to what the GPU had before: that may have been
    another claim's setting or a leftover of a crash, and nothing records what an administrator
    meant. NVIDIA's DRA driver also sets Default on unprepare.
    """

    time_slices: tuple[TimeSliceSetting, ...] = ()
    stop_mps: bool = False


class SharingPlan(msgspec.Struct, frozen=True):
    time_slices: tuple[TimeSliceSetting, ...] = ()
    mps: MpsDaemonSpec | None = None
    # Whole GPUs the MPS daemon serves, set to ExclusiveProcess while the claim is prepared
    # (NVIDIA's MPS documentation): the MPS server is then the only CUDA context on them. MIG
    # devices leave their GPU's mode alone: other claims share that GPU.
    exclusive_process_gpus: tuple[str, ...] = ()

    @property
    def container_edits(self) -> ContainerEdits:
        """The claim-wide edits (empty without MPS)."""
        return self.mps.container_edits() if self.mps else ContainerEdits()

    @property
    def restore(self) -> RestorePlan:
        return RestorePlan(
            time_slices=tuple(TimeSliceSetting(change.gpu_uuid, "Default") for change in self.time_slices),
            stop_mps=self.mps is not None,
        )


def check_sharing(devices: Sequence[SharedDevice]) -> None:
    """Raises OpaqueConfigError for the sharing `devices` ask for that cannot be honoured (the
    list in plan_sharing). It reads the configs alone, so the engine runs it before it reserves
    or creates anything: a MIG instance that prepare would create is named by a placeholder
    UUID, which no per-device key can match (the user cannot know it in advance)."""
    ordered = sorted(devices, key=lambda device: natural_key(device.name))
    for device in ordered:
        _check_fits(device)
    if any(device.sharing.strategy == "MPS" for device in ordered):
        _pinned_limits(_claim_mps_settings(ordered), ordered)


def plan_sharing(claim_uid: str, devices: Sequence[SharedDevice], mps_runtime_dir: Path) -> SharingPlan:
    """The sharing plan of claim `claim_uid` with allocated `devices`.

    Devices are taken in natural order of their names (gpu-2 before gpu-10); that order numbers
    them for MPS. Raises OpaqueConfigError for what cannot be honoured, and InvalidClaimIdentity
    for a bad claim UID when the claim uses MPS:
    - a time slice other than Default on a MIG device or a vGPU (the setting belongs to the whole
      GPU, which others share);
    - MPS on a vGPU (it changes how the whole GPU runs);
    - MPS on some devices of a claim but not all (a process that reaches an MPS server sees only
      that server's devices, so the claim's other devices would vanish from its containers);
    - different MPS settings within one claim (one daemon serves the claim, with one set of defaults);
    - a per-device pinned memory limit naming no device of the claim, two keys naming one device,
      or a limit under 1 MiB.
    """
    check_sharing(devices)
    ordered = sorted(devices, key=lambda device: natural_key(device.name))
    mps_devices = [device for device in ordered if device.sharing.strategy == "MPS"]
    return SharingPlan(
        time_slices=tuple(
            TimeSliceSetting(device.gpu_uuid, _time_slicing(device).interval)
            for device in ordered
            if device.type == "gpu"
            and device.sharing.strategy == "TimeSlicing"
            # Default leaves the GPU's setting alone (see TimeSlicingSettings).
            and _time_slicing(device).interval != "Default"
        ),
        mps=_mps_spec(claim_uid, ordered, mps_runtime_dir) if mps_devices else None,
        exclusive_process_gpus=tuple(device.gpu_uuid for device in mps_devices if device.type == "gpu"),
    )


def _time_slicing(device: SharedDevice) -> TimeSlicingSettings:
    return device.sharing.time_slicing or TimeSlicingSettings()


def _mps_settings(device: SharedDevice) -> MpsSettings:
    return device.sharing.mps or MpsSettings()


def _check_fits(device: SharedDevice) -> None:
    if device.type == "gpu":
        return
    kind = "MIG device" if device.type == "mig" else "vGPU"
    if device.sharing.strategy == "TimeSlicing" and _time_slicing(device).interval != "Default":
        raise OpaqueConfigError(
            f"device {device.name}: time slice {_time_slicing(device).interval} cannot be set for a {kind}: "
            f"the time slice is a setting of the whole GPU {device.gpu_uuid}, which others share"
        )
    if device.type == "vgpu" and device.sharing.strategy == "MPS":
        raise OpaqueConfigError(
            f"device {device.name}: MPS is not supported for a vGPU: it changes how the whole GPU "
            f"{device.gpu_uuid} runs, and other claims share that GPU"
        )


def _listed(devices: Sequence[SharedDevice]) -> str:
    return ", ".join(f"{index}: {device.name} ({device.uuid})" for index, device in enumerate(devices))


def _claim_mps_settings(devices: Sequence[SharedDevice]) -> MpsSettings:
    """The one set of MPS settings of a claim whose devices use MPS."""
    others = [device.name for device in devices if device.sharing.strategy != "MPS"]
    if others:
        raise OpaqueConfigError(
            f"devices {', '.join(others)} do not use MPS while the claim's other devices do: a process "
            "that reaches an MPS server sees only that server's devices; give every request of the "
            "claim the same sharing strategy"
        )
    settings = _mps_settings(devices[0])
    for device in devices[1:]:
        if _mps_settings(device) != settings:
            raise OpaqueConfigError(
                f"devices {devices[0].name} and {device.name} have different MPS settings, but one MPS "
                "daemon serves the whole claim with one set of defaults; give them the same config"
            )
    return settings


def _mps_spec(claim_uid: str, devices: Sequence[SharedDevice], runtime_dir: Path) -> MpsDaemonSpec:
    settings = _claim_mps_settings(devices)
    return MpsDaemonSpec(
        directories=MpsDirectories(runtime_dir, claim_uid),
        device_uuids=tuple(device.uuid for device in devices),
        active_thread_percentage=settings.default_active_thread_percentage,
        pinned_memory_limits=_pinned_limits(settings, devices),
    )


def _pinned_limits(settings: MpsSettings, devices: Sequence[SharedDevice]) -> tuple[PinnedMemoryLimit, ...]:
    """The default limit for every device, replaced where the per-device mapping names the device
    by its index or UUID (the precedence NVIDIA's MPS config also has)."""
    default = settings.default_pinned_device_memory_limit
    limits: dict[int, int] = {} if default is None else dict.fromkeys(range(len(devices)), default)
    limits.update(_per_device_limits(settings.default_per_device_pinned_memory_limit, devices))
    return tuple(
        PinnedMemoryLimit(index, devices[index].uuid, _mebibytes(limits[index], devices[index]))
        for index in sorted(limits)
    )


def _per_device_limits(per_device: Mapping[str, int], devices: Sequence[SharedDevice]) -> dict[int, int]:
    path = "sharing.mps.defaultPerDevicePinnedMemoryLimit"
    index_of_uuid = {device.uuid: index for index, device in enumerate(devices)}
    limits: dict[int, int] = {}
    key_of_index: dict[int, str] = {}
    for key, limit in sorted(per_device.items()):
        index = int(key) if key.isdigit() else index_of_uuid.get(key)
        if index is None or index >= len(devices):
            raise OpaqueConfigError(
                f"{path}: key {key!r} names no device of this claim; its devices are {_listed(devices)}"
            )
        if index in key_of_index:
            raise OpaqueConfigError(
                f"{path}: keys {key_of_index[index]!r} and {key!r} both name device {devices[index].name}"
            )
        key_of_index[index] = key
        limits[index] = limit
    return limits


def _mebibytes(limit: int, device: SharedDevice) -> int:
    mebibytes = limit // MIB
    if mebibytes == 0:
        raise OpaqueConfigError(
            f"sharing.mps: the pinned memory limit of device {device.name} is {limit} bytes; MPS takes "
            "limits in whole MiB, so it must be at least 1Mi"
        )
    return mebibytes
