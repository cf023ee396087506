"""The NVML backend over nvidia-ml-py (import name `pynvml`).

NVML calls block, sometimes for long (a GPU that fell off the bus), so they all run on one
dedicated worker thread: the event loop that answers kubelet never waits on the driver, and
NVML sees calls one at a time. That also makes a MIG change (several NVML calls) atomic with
respect to discovery and to other changes made through this backend.

NVML has no "list" calls for MIG: it is asked about each NVML_*_PROFILE_* constant in turn and
answers NOT_SUPPORTED or INVALID_ARGUMENT for the ones a GPU lacks, and it fills arrays that the
caller allocates. The helpers below hide both habits.
"""

import asyncio
import ctypes
import functools
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import pynvml

from dra_driver.hardware.mig_names import mig_profile_name
from dra_driver.hardware.model import (
    Gpu,
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    MigProfile,
    Placement,
)
from dra_driver.hardware.simulated import gpu_models

_T = TypeVar("_T")
# pynvml hands out ctypes pointers and structures; they are opaque to this module's types.
NvmlObject: TypeAlias = Any

MIB = 2**20

# Names as the NVIDIA tooling (go-nvlib) prints them, so selectors written for other drivers still match.
_BRANDS = {
    pynvml.NVML_BRAND_UNKNOWN: "Unknown",
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "Grid",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    pynvml.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC",
    pynvml.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    pynvml.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS",
    pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    pynvml.NVML_BRAND_QUADRO_RTX: "QuadroRTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia",
    pynvml.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    pynvml.NVML_BRAND_TITAN_RTX: "TitanRTX",
}
_ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}
_REASONS: dict[int, HardwareErrorReason] = {
    pynvml.NVML_ERROR_INVALID_ARGUMENT: HardwareErrorReason.INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NOT_SUPPORTED: HardwareErrorReason.NOT_SUPPORTED,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: HardwareErrorReason.INSUFFICIENT_RESOURCES,
    pynvml.NVML_ERROR_NOT_FOUND: HardwareErrorReason.NOT_FOUND,
    pynvml.NVML_ERROR_GPU_IS_LOST: HardwareErrorReason.GPU_LOST,
    pynvml.NVML_ERROR_NO_PERMISSION: HardwareErrorReason.NO_PERMISSION,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: HardwareErrorReason.LIBRARY_NOT_FOUND,
}
_LIBRARY_HINT = (
    " (libnvidia-ml.so.1 is not installed or not mounted into the container; "
    "on machines without NVIDIA GPUs use --hardware simulated:<profile>)"
)
# How NVML says "this GPU has no such profile" (the constant is unknown to it, or not offered here).
_NO_SUCH_PROFILE = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})
_NOT_SUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED})
# MIG device indices are sparse: an index without a compute instance behind it answers one of these.
_NO_MIG_DEVICE_AT_INDEX = frozenset({pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT})
# GPUs outside an NVLink fabric answer NOT_SUPPORTED; drivers older than the V call lack it entirely.
_NO_FABRIC = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
_SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def _text(value: str | bytes) -> str:
    """Older nvidia-ml-py releases return bytes where newer ones return str."""
    return value.decode() if isinstance(value, bytes) else value


def _hardware_error(what: str, error: Exception) -> HardwareError:
    code: int = getattr(error, "value", pynvml.NVML_ERROR_UNKNOWN)
    hint = _LIBRARY_HINT if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND else ""
    return HardwareError(f"NVML {what} failed: {error}{hint}", _REASONS.get(code, HardwareErrorReason.OTHER))


def nvml_call(what: str, function: Callable[..., _T], *args: Any) -> _T:
    """Runs one NVML function, turning its error into a HardwareError that says what was asked and
    carries a reason callers can act on without parsing NVML's text."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise _hardware_error(what, error) from error


def _nvml_call_or_none(
    what: str, absent: frozenset[int], function: Callable[..., _T], *args: Any
) -> _T | None:
    """nvml_call for questions NVML answers "no" to with an error code: None for the codes in `absent`."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        if getattr(error, "value", None) in absent:
            return None
        raise _hardware_error(what, error) from error


def normalize_bus_id(nvml_bus_id: str) -> str:
    """NVML prints an 8-digit PCI domain in upper case; sysfs and Kubernetes use 4 digits, lower case."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def pcie_root_of(bus_id: str, sysfs_devices: Path = _SYSFS_PCI_DEVICES) -> str:
    """The root complex ('pci<domain>:<bus>') the device hangs off, read from its sysfs path."""
    link = sysfs_devices / bus_id
    if not link.exists():
        raise HardwareError(f"cannot find GPU {bus_id} under {sysfs_devices}: is /sys mounted?")
    resolved = Path(os.path.realpath(link))
    roots = [part for part in resolved.parts if part.startswith("pci")]
    if not roots:
        raise HardwareError(f"cannot find the PCIe root of GPU {bus_id}: {resolved} has no pci<domain>:<bus>")
    return roots[0]


def numa_node_of(bus_id: str, sysfs_devices: Path = _SYSFS_PCI_DEVICES) -> int | None:
    """The NUMA node the kernel ties the GPU to. NVML has no call for it; sysfs writes -1 where the
    platform has no affinity (one socket, many VMs), and kernels built without NUMA omit the file."""
    path = sysfs_devices / bus_id / "numa_node"
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    try:
        node = int(text)
    except ValueError as error:
        raise HardwareError(f"{path} holds {text!r}, not a NUMA node number") from error
    return node if node >= 0 else None


def _mig_mode(handle: NvmlObject, where: str) -> MigMode:
    """The current mode; a pending change only takes effect after a GPU reset, so it is not reported."""
    modes = _nvml_call_or_none(
        f"nvmlDeviceGetMigMode {where}", _NOT_SUPPORTED, pynvml.nvmlDeviceGetMigMode, handle
    )
    if modes is None:
        return MigMode.UNSUPPORTED
    current, _pending = modes
    return MigMode.ENABLED if current == pynvml.NVML_DEVICE_MIG_ENABLE else MigMode.DISABLED


def _gpu_instance_profile_infos(handle: NvmlObject, where: str) -> list[tuple[int, NvmlObject]]:
    """(NVML_GPU_INSTANCE_PROFILE_* constant, nvmlGpuInstanceProfileInfo_v2_t) of each profile the GPU
    offers; the constant is kept because it, not the profile id, decides the name's suffix."""
    found = []
    for nvml_enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _nvml_call_or_none(
            f"nvmlDeviceGetGpuInstanceProfileInfo(profile constant {nvml_enum}) {where}",
            _NO_SUCH_PROFILE,
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
            handle,
            nvml_enum,
        )
        if info is not None:
            found.append((nvml_enum, info))
    return found


def _possible_placements(handle: NvmlObject, profile_id: int, where: str) -> tuple[Placement, ...]:
    """NVML fills a caller-sized array, so the count is asked first (with a NULL array): a profile can
    have more placements than instances (A100 1g.5gb+me: one instance, seven places).

    Older drivers answer NOT_SUPPORTED while MIG mode is off; the profile then has no placements
    (nothing can be created on such a GPU anyway).
    """
    what = f"nvmlDeviceGetGpuInstancePossiblePlacements(profile {profile_id}) {where}"
    count = ctypes.c_uint(0)
    asked = _nvml_call_or_none(
        what,
        _NOT_SUPPORTED,
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
        handle,
        profile_id,
        None,
        ctypes.pointer(count),
    )
    if asked is None:
        return ()
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml_call(
        what,
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
        handle,
        profile_id,
        placements,
        ctypes.pointer(count),
    )
    return tuple(
        Placement(start=placement.start, size=placement.size) for placement in placements[: count.value]
    )


def _mig_profile(
    handle: NvmlObject, nvml_enum: int, info: NvmlObject, gpu_memory_bytes: int, where: str
) -> MigProfile:
    memory_bytes = info.memorySizeMB * MIB  # NVML's "MB" is MiB.
    return MigProfile(
        profile_id=info.id,
        nvml_enum=nvml_enum,
        name=mig_profile_name(nvml_enum, info.sliceCount, memory_bytes, gpu_memory_bytes),
        compute_slices=info.sliceCount,
        memory_bytes=memory_bytes,
        multiprocessors=info.multiprocessorCount,
        copy_engines=info.copyEngineCount,
        decoders=info.decoderCount,
        encoders=info.encoderCount,
        jpeg_engines=info.jpegCount,
        ofa_engines=info.ofaCount,
        max_instances=info.instanceCount,
        placements=_possible_placements(handle, info.id, where),
    )


def _mig_profiles(handle: NvmlObject, gpu_memory_bytes: int, where: str) -> tuple[MigProfile, ...]:
    return tuple(
        _mig_profile(handle, nvml_enum, info, gpu_memory_bytes, where)
        for nvml_enum, info in _gpu_instance_profile_infos(handle, where)
    )


def _filled_handles(
    what: str, function: Callable[..., Any], owner: NvmlObject, profile_id: int, capacity: int, kind: Any
) -> list[NvmlObject]:
    """For NVML's "instances of a profile" calls, which fill an array the caller sizes to the profile's
    instance count. The count goes in as the capacity too, for NVML versions that read it."""
    handles = (kind * capacity)()
    count = ctypes.c_uint(capacity)
    nvml_call(what, function, owner, profile_id, handles, ctypes.pointer(count))
    return list(handles[: count.value])


def _compute_instance_profile_infos(gpu_instance: NvmlObject, where: str) -> list[NvmlObject]:
    """The nvmlComputeInstanceProfileInfo_v2_t of each compute instance profile the GPU instance offers."""
    infos = (
        _nvml_call_or_none(
            f"nvmlGpuInstanceGetComputeInstanceProfileInfo(profile constant {ci_enum}) {where}",
            _NO_SUCH_PROFILE,
            pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gpu_instance,
            ci_enum,
            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        for ci_enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
    )
    return [info for info in infos if info is not None]


def _compute_instances(gpu_instance: NvmlObject, where: str) -> list[tuple[NvmlObject, NvmlObject]]:
    """(compute instance handle, its profile info) for every compute instance in the GPU instance."""
    return [
        (compute_instance, profile)
        for profile in _compute_instance_profile_infos(gpu_instance, where)
        for compute_instance in _filled_handles(
            f"nvmlGpuInstanceGetComputeInstances(profile {profile.id}) {where}",
            pynvml.nvmlGpuInstanceGetComputeInstances,
            gpu_instance,
            profile.id,
            profile.instanceCount,
            pynvml.c_nvmlComputeInstance_t,
        )
    ]


def _mig_device_uuids(handle: NvmlObject, where: str) -> dict[tuple[int, int], str]:
    """MIG UUIDs by (GPU instance id, compute instance id): NVML gives a UUID only to a MIG device
    handle, and finds those only by index, so every index is visited."""
    count = nvml_call(
        f"nvmlDeviceGetMaxMigDeviceCount {where}", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle
    )
    uuids = {}
    for index in range(count):
        mig_where = f"{where} MIG device {index}"
        device = _nvml_call_or_none(
            f"nvmlDeviceGetMigDeviceHandleByIndex {mig_where}",
            _NO_MIG_DEVICE_AT_INDEX,
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
            handle,
            index,
        )
        if device is None:
            continue
        key = (
            nvml_call(f"nvmlDeviceGetGpuInstanceId {mig_where}", pynvml.nvmlDeviceGetGpuInstanceId, device),
            nvml_call(
                f"nvmlDeviceGetComputeInstanceId {mig_where}", pynvml.nvmlDeviceGetComputeInstanceId, device
            ),
        )
        uuids[key] = _text(nvml_call(f"nvmlDeviceGetUUID {mig_where}", pynvml.nvmlDeviceGetUUID, device))
    return uuids


def _placement_of(gpu_instance_info: NvmlObject) -> Placement:
    return Placement(start=gpu_instance_info.placement.start, size=gpu_instance_info.placement.size)


def _mig_instance(
    gpu_instance_info: NvmlObject,
    compute_instance: NvmlObject,
    compute_profile: NvmlObject,
    uuids: dict[tuple[int, int], str],
    where: str,
) -> MigInstance:
    info = nvml_call(
        f"nvmlComputeInstanceGetInfo {where}", pynvml.nvmlComputeInstanceGetInfo, compute_instance
    )
    mig_uuid = uuids.get((gpu_instance_info.id, info.id))
    if mig_uuid is None:
        raise HardwareError(
            f"NVML lists compute instance {info.id} {where} but no MIG device for it; "
            "did the MIG layout change while it was being read?"
        )
    return MigInstance(
        uuid=mig_uuid,
        profile_id=gpu_instance_info.profileId,
        placement=_placement_of(gpu_instance_info),
        gpu_instance_id=gpu_instance_info.id,
        compute_instance_id=info.id,
        compute_slices=compute_profile.sliceCount,
        multiprocessors=compute_profile.multiprocessorCount,
    )


def _read_gpu_instance(
    gpu_instance: NvmlObject, uuids: dict[tuple[int, int], str], where: str
) -> list[MigInstance]:
    """One MigInstance per compute instance of the GPU instance.

    A GPU instance without any compute instance (a half-finished `nvidia-smi mig -cgi`, or a crash
    between the two steps) is reported too, with compute_instance_id -1, compute_slices 0,
    multiprocessors 0 and uuid "". Nothing can run on it, so the device model offers no device for
    it, but it still holds its memory slices: hiding it would misstate what is free.
    """
    info = nvml_call(f"nvmlGpuInstanceGetInfo {where}", pynvml.nvmlGpuInstanceGetInfo, gpu_instance)
    instance_where = f"{where} GPU instance {info.id}"
    compute_instances = _compute_instances(gpu_instance, instance_where)
    if not compute_instances:
        return [
            MigInstance(
                uuid="",
                profile_id=info.profileId,
                placement=_placement_of(info),
                gpu_instance_id=info.id,
                compute_instance_id=-1,
                compute_slices=0,
                multiprocessors=0,
            )
        ]
    return [
        _mig_instance(info, compute_instance, profile, uuids, instance_where)
        for compute_instance, profile in compute_instances
    ]


def _mig_instances(
    handle: NvmlObject, profiles: tuple[MigProfile, ...], where: str
) -> tuple[MigInstance, ...]:
    uuids = _mig_device_uuids(handle, where)
    instances = [
        instance
        for profile in profiles
        for gpu_instance in _filled_handles(
            f"nvmlDeviceGetGpuInstances(profile {profile.profile_id}) {where}",
            pynvml.nvmlDeviceGetGpuInstances,
            handle,
            profile.profile_id,
            profile.max_instances,
            pynvml.c_nvmlGpuInstance_t,
        )
        for instance in _read_gpu_instance(gpu_instance, uuids, where)
    ]
    return tuple(
        sorted(instances, key=lambda instance: (instance.gpu_instance_id, instance.compute_instance_id))
    )


def _fabric_clique(handle: NvmlObject, where: str) -> str | None:
    """'<cluster UUID>.<clique ID>' once the fabric manager has registered the GPU in an NVLink
    domain (GB200 NVL and the like); None elsewhere and while registration is still under way,
    since a clique that is not final must not be advertised."""
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    answered = _nvml_call_or_none(
        f"nvmlDeviceGetGpuFabricInfoV {where}",
        _NO_FABRIC,
        pynvml.nvmlDeviceGetGpuFabricInfoV,
        handle,
        ctypes.pointer(info),
    )
    if answered is None or info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return None
    cluster = bytes(info.clusterUuid)
    if info.status != pynvml.NVML_SUCCESS or not any(cluster):
        return None
    return f"{uuid.UUID(bytes=cluster)}.{info.cliqueId}"


def _multiprocessors(handle: Any, product_name: str, where: str) -> int:
    """NVML documents nvmlDeviceGetAttributes for MIG devices only, and many drivers refuse it on
    a whole GPU; then the catalog's count for the product is used, and 0 means unknown (the
    device model leaves the capacity out rather than publish a wrong number)."""
    try:
        attributes = nvml_call(f"nvmlDeviceGetAttributes {where}", pynvml.nvmlDeviceGetAttributes, handle)
    except HardwareError as error:
        if error.reason not in (HardwareErrorReason.NOT_SUPPORTED, HardwareErrorReason.INVALID_ARGUMENT):
            raise
        known = {model.product_name: model.multiprocessors for model in gpu_models().values()}
        return known.get(product_name, 0)
    count: int = attributes.multiprocessorCount
    return count


def _read_gpu(index: int, driver_version: str, cuda_driver_version: str, sysfs_devices: Path) -> Gpu:
    handle = nvml_call(f"nvmlDeviceGetHandleByIndex({index})", pynvml.nvmlDeviceGetHandleByIndex, index)
    where = f"for GPU {index}"
    major, minor_cc = nvml_call(
        f"nvmlDeviceGetCudaComputeCapability {where}", pynvml.nvmlDeviceGetCudaComputeCapability, handle
    )
    bus_id = normalize_bus_id(
        _text(nvml_call(f"nvmlDeviceGetPciInfo {where}", pynvml.nvmlDeviceGetPciInfo, handle).busId)
    )
    brand = nvml_call(f"nvmlDeviceGetBrand {where}", pynvml.nvmlDeviceGetBrand, handle)
    architecture = nvml_call(f"nvmlDeviceGetArchitecture {where}", pynvml.nvmlDeviceGetArchitecture, handle)
    memory_bytes = nvml_call(f"nvmlDeviceGetMemoryInfo {where}", pynvml.nvmlDeviceGetMemoryInfo, handle).total
    product_name = _text(nvml_call(f"nvmlDeviceGetName {where}", pynvml.nvmlDeviceGetName, handle))
    mig_mode = _mig_mode(handle, where)
    profiles = () if mig_mode is MigMode.UNSUPPORTED else _mig_profiles(handle, memory_bytes, where)
    return Gpu(
        uuid=_text(nvml_call(f"nvmlDeviceGetUUID {where}", pynvml.nvmlDeviceGetUUID, handle)),
        index=index,
        minor=nvml_call(f"nvmlDeviceGetMinorNumber {where}", pynvml.nvmlDeviceGetMinorNumber, handle),
        product_name=product_name,
        brand=_BRANDS.get(brand, f"Brand{brand}"),
        architecture=_ARCHITECTURES.get(architecture, f"Architecture{architecture}"),
        cuda_compute_capability=f"{major}.{minor_cc}",
        memory_bytes=memory_bytes,
        multiprocessors=_multiprocessors(handle, product_name, where),
        pci_bus_id=bus_id,
        pcie_root=pcie_root_of(bus_id, sysfs_devices),
        numa_node=numa_node_of(bus_id, sysfs_devices),
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        mig_mode=mig_mode,
        memory_slices=max(
            (placement.start + placement.size for profile in profiles for placement in profile.placements),
            default=0,
        ),
        mig_profiles=profiles,
        mig_instances=_mig_instances(handle, profiles, where) if mig_mode is MigMode.ENABLED else (),
        fabric_clique=_fabric_clique(handle, where),
    )


def _discover(sysfs_devices: Path) -> tuple[Gpu, ...]:
    driver_version = _text(nvml_call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
    cuda = nvml_call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
    cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
    count = nvml_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
    return tuple(
        _read_gpu(index, driver_version, cuda_driver_version, sysfs_devices) for index in range(count)
    )


def _handle_by_uuid(gpu_uuid: str, where: str) -> NvmlObject:
    return nvml_call(f"nvmlDeviceGetHandleByUUID {where}", pynvml.nvmlDeviceGetHandleByUUID, gpu_uuid)


def _gpu_instance_profile_info(handle: NvmlObject, gpu_uuid: str, profile_id: int, where: str) -> NvmlObject:
    """Searches the profile constants rather than calling nvmlDeviceGetGpuInstanceProfileInfoByIdV:
    pynvml has it, but only recent drivers export it, and MIG nodes often run long-term-support ones."""
    for _nvml_enum, info in _gpu_instance_profile_infos(handle, where):
        if info.id == profile_id:
            return info
    raise HardwareError(
        f"GPU {gpu_uuid} has no MIG profile {profile_id}", HardwareErrorReason.INVALID_ARGUMENT
    )


def _full_compute_instance_profile(gpu_instance: NvmlObject, compute_slices: int, where: str) -> NvmlObject:
    """The compute instance profile that spans the whole GPU instance (the lowest constant wins where
    a variant such as 7_SLICE_NVL has the same size)."""
    for profile in _compute_instance_profile_infos(gpu_instance, where):
        if profile.sliceCount == compute_slices:
            return profile
    raise HardwareError(f"NVML offers no compute instance profile of {compute_slices} slices {where}")


def _destroy_gpu_instance(gpu_instance: NvmlObject, where: str) -> None:
    """Compute instances first: NVML refuses to destroy a GPU instance that still has one (IN_USE)."""
    for compute_instance, _profile in _compute_instances(gpu_instance, where):
        nvml_call(f"nvmlComputeInstanceDestroy {where}", pynvml.nvmlComputeInstanceDestroy, compute_instance)
    nvml_call(f"nvmlGpuInstanceDestroy {where}", pynvml.nvmlGpuInstanceDestroy, gpu_instance)


def _add_compute_instance(
    handle: NvmlObject, gpu_instance: NvmlObject, compute_slices: int, where: str
) -> MigInstance:
    info = nvml_call(f"nvmlGpuInstanceGetInfo {where}", pynvml.nvmlGpuInstanceGetInfo, gpu_instance)
    instance_where = f"{where} GPU instance {info.id}"
    profile = _full_compute_instance_profile(gpu_instance, compute_slices, instance_where)
    compute_instance = nvml_call(
        f"nvmlGpuInstanceCreateComputeInstance(profile {profile.id}) {instance_where}",
        pynvml.nvmlGpuInstanceCreateComputeInstance,
        gpu_instance,
        profile.id,
    )
    return _mig_instance(info, compute_instance, profile, _mig_device_uuids(handle, where), instance_where)


def _create_mig_instance(gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
    where = f"for GPU {gpu_uuid}"
    handle = _handle_by_uuid(gpu_uuid, where)
    if _mig_mode(handle, where) is not MigMode.ENABLED:
        raise HardwareError(
            f"cannot create a MIG instance on GPU {gpu_uuid}: MIG mode is not enabled",
            HardwareErrorReason.NOT_SUPPORTED,
        )
    profile = _gpu_instance_profile_info(handle, gpu_uuid, profile_id, where)
    gpu_instance = nvml_call(
        f"nvmlDeviceCreateGpuInstanceWithPlacement(profile {profile_id}, "
        f"memory slices {placement.start}..{placement.start + placement.size - 1}) {where}",
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
        handle,
        profile_id,
        ctypes.pointer(pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)),
    )
    try:
        return _add_compute_instance(handle, gpu_instance, profile.sliceCount, where)
    except Exception as error:
        _roll_back(gpu_instance, error, where)
        raise


def _roll_back(gpu_instance: NvmlObject, error: Exception, where: str) -> None:
    """A GPU instance without a usable compute instance only blocks memory slices: remove it, and say
    so on the original error if even that fails."""
    try:
        _destroy_gpu_instance(gpu_instance, f"{where} (rolling back the new GPU instance)")
    except HardwareError as cleanup_error:
        error.add_note(f"the new GPU instance could not be removed and is left behind: {cleanup_error}")


def _destroy_mig_instance(gpu_uuid: str, gpu_instance_id: int) -> None:
    where = f"for GPU {gpu_uuid}"
    handle = _handle_by_uuid(gpu_uuid, where)
    try:
        gpu_instance = nvml_call(
            f"nvmlDeviceGetGpuInstanceById({gpu_instance_id}) {where}",
            pynvml.nvmlDeviceGetGpuInstanceById,
            handle,
            gpu_instance_id,
        )
    except HardwareError as error:
        # NVML answers INVALID_ARGUMENT, not NOT_FOUND, for some ids that name no instance.
        if error.reason in (HardwareErrorReason.NOT_FOUND, HardwareErrorReason.INVALID_ARGUMENT):
            raise HardwareError(
                f"GPU instance {gpu_instance_id} does not exist on GPU {gpu_uuid} ({error})",
                HardwareErrorReason.NOT_FOUND,
            ) from error
        raise
    _destroy_gpu_instance(gpu_instance, f"{where} GPU instance {gpu_instance_id}")


class NvmlBackend:
    def __init__(self, sysfs_devices: Path = _SYSFS_PCI_DEVICES) -> None:
        """`sysfs_devices` is where the GPUs' PCI entries are read from (PCIe root, NUMA node)."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._initialized = False
        self._sysfs_devices = sysfs_devices

    @property
    def description(self) -> str:
        return "NVML (nvidia-ml-py)"

    async def _on_nvml_thread(self, function: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, function)

    async def _initialized_then(self, function: Callable[[], _T]) -> _T:
        """Runs `function` on the NVML thread, after nvmlInit the first time through. The flag is set on
        that thread, so two first calls at once cannot initialize NVML twice."""

        def call() -> _T:
            if not self._initialized:
                nvml_call("nvmlInit", pynvml.nvmlInit)
                self._initialized = True
            return function()

        return await self._on_nvml_thread(call)

    async def discover(self) -> tuple[Gpu, ...]:
        return await self._initialized_then(functools.partial(_discover, self._sysfs_devices))

    async def create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        return await self._initialized_then(
            functools.partial(_create_mig_instance, gpu_uuid, profile_id, placement)
        )

    async def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        await self._initialized_then(functools.partial(_destroy_mig_instance, gpu_uuid, gpu_instance_id))

    async def close(self) -> None:
        if self._initialized:
            await self._on_nvml_thread(lambda: nvml_call("nvmlShutdown", pynvml.nvmlShutdown))
            self._initialized = False
        self._thread.shutdown(wait=False)
