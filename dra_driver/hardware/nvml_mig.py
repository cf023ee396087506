"""MIG through NVML: the mode, the profiles and their placements, the instances with their UUIDs
(discovery), and creating and destroying instances (with rollback of a half-made one).

NVML has no "list" calls for MIG: it is asked about each NVML_*_PROFILE_* constant in turn and
answers NOT_SUPPORTED or INVALID_ARGUMENT for the ones a GPU lacks, and it fills arrays that the
caller allocates. The helpers below hide both habits.

Every function here calls NVML and so must run on the NVML backend's worker thread.
"""

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from dra_driver.hardware.mig_names import mig_profile_name
from dra_driver.hardware.model import (
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    MigProfile,
    Placement,
)
from dra_driver.hardware.nvml_calls import (
    NO_MIG_DEVICE_AT_INDEX,
    NO_SUCH_PROFILE,
    NOT_SUPPORTED,
    NvmlObject,
    nvml_call,
    nvml_call_or_none,
    nvml_text,
)

MIB = 2**20


def mig_mode(handle: NvmlObject, where: str) -> MigMode:
    """The current mode; a pending change only takes effect after a GPU reset, so it is not reported."""
    modes = nvml_call_or_none(
        f"nvmlDeviceGetMigMode {where}", NOT_SUPPORTED, pynvml.nvmlDeviceGetMigMode, handle
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
        info = nvml_call_or_none(
            f"nvmlDeviceGetGpuInstanceProfileInfo(profile constant {nvml_enum}) {where}",
            NO_SUCH_PROFILE,
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
    asked = nvml_call_or_none(
        what,
        NOT_SUPPORTED,
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


def mig_profiles(handle: NvmlObject, gpu_memory_bytes: int, where: str) -> tuple[MigProfile, ...]:
    """Smallest first (compute slices, then memory, then the constant), the catalog's order: NVML's
    own order is that of the constants, and the devices offered must not depend on the backend."""
    profiles = (
        _mig_profile(handle, nvml_enum, info, gpu_memory_bytes, where)
        for nvml_enum, info in _gpu_instance_profile_infos(handle, where)
    )
    return tuple(
        sorted(
            profiles, key=lambda profile: (profile.compute_slices, profile.memory_bytes, profile.nvml_enum)
        )
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
        nvml_call_or_none(
            f"nvmlGpuInstanceGetComputeInstanceProfileInfo(profile constant {ci_enum}) {where}",
            NO_SUCH_PROFILE,
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
        device = nvml_call_or_none(
            f"nvmlDeviceGetMigDeviceHandleByIndex {mig_where}",
            NO_MIG_DEVICE_AT_INDEX,
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
        uuids[key] = nvml_text(nvml_call(f"nvmlDeviceGetUUID {mig_where}", pynvml.nvmlDeviceGetUUID, device))
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


def mig_instances(
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


def create_mig_instance(gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
    where = f"for GPU {gpu_uuid}"
    handle = _handle_by_uuid(gpu_uuid, where)
    if mig_mode(handle, where) is not MigMode.ENABLED:
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


def destroy_mig_instance(gpu_uuid: str, gpu_instance_id: int) -> None:
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
