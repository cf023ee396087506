"""The NVML backend without a GPU: its errors, its pure helpers, and its NVML glue against a script.

`ScriptedNvml` answers like one A100-SXM4-40GB would. It hands out pynvml's own structures and
expects pynvml's own ctypes arrays and pointers, raises pynvml.NVMLError where NVML returns an
error, and replaces pynvml's functions by name (monkeypatch refuses a name pynvml lacks). So a
misspelt function or structure field, an array of the wrong type or size, or a step done in the
wrong order (a GPU instance destroyed before its compute instances) fails here. How a real
driver answers cannot be shown without a GPU; docs/hardware.md says how to check that.
"""

import ctypes
import itertools
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import pynvml
import pytest

from dra_driver.hardware.model import (
    Gpu,
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    MigProfile,
    Placement,
)
from dra_driver.hardware.nvml import NvmlBackend
from dra_driver.hardware.nvml_calls import normalize_bus_id, numa_node_of, nvml_call, pcie_root_of
from tests.support.mock_nvml import WITHOUT_HOST_NVML

MIB = 2**20
GPU_UUID = "GPU-5a0e2c07-37f9-4c2b-8d6e-1f3b2c4d5e6f"
BUS_ID = "0000:07:00.0"
MEMORY_MIB = 40537
ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
# Compute instance profile ids are offset from their constants here, so that code passing one
# where NVML wants the other fails (real drivers happen to use equal numbers for these).
CI_ID_OFFSET = 100
CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}
MULTIPROCESSORS_PER_SLICE = 14


@dataclass(frozen=True)
class ScriptedProfile:
    nvml_enum: int
    profile_id: int
    slices: int
    memory_mib: int
    instances: int
    placements: tuple[tuple[int, int], ...]
    # copy engines, decoders, encoders, JPEG, OFA
    engines: tuple[int, int, int, int, int]


ONE_SLICE_PLACES = tuple((start, 1) for start in range(7))
A100_PROFILES = (
    ScriptedProfile(
        pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 4864, 7, ONE_SLICE_PLACES, (1, 0, 0, 0, 0)
    ),
    ScriptedProfile(
        pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 4864, 1, ONE_SLICE_PLACES, (1, 1, 0, 1, 1)
    ),
    ScriptedProfile(
        pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 19968, 2, ((0, 4), (4, 4)), (3, 2, 0, 0, 0)
    ),
    ScriptedProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 40192, 1, ((0, 8),), (7, 5, 0, 1, 1)),
)


@dataclass
class ScriptedGpuInstance:
    id: int
    profile: ScriptedProfile
    placement: tuple[int, int]
    # compute instance id -> compute instance profile id
    compute_instances: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptedFabric:
    state: int
    status: int
    cluster_uuid: bytes
    clique_id: int


class MigDevice(NamedTuple):
    gpu_instance_id: int
    compute_instance_id: int


GPU_HANDLE = object()


def mig_uuid(gpu_instance_id: int, compute_instance_id: int) -> str:
    return f"MIG-00000000-0000-4000-8000-{gpu_instance_id:06x}{compute_instance_id:06x}"


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _struct(kind: Any, **values: Any) -> Any:
    """A pynvml structure with `values` set; refuses a field the structure does not have."""
    known = {name for name, *_ in kind._fields_}
    assert set(values) <= known, f"{kind.__name__} has no field {sorted(set(values) - known)}"
    made = kind()
    for name, value in values.items():
        setattr(made, name, value)
    return made


def _fill(array: Any, element_type: Any, values: list[Any], count: Any) -> int:
    """What NVML does with a caller's array: too small is INSUFFICIENT_SIZE, the count goes back."""
    assert isinstance(array, ctypes.Array)
    assert array._type_ is element_type, f"an array of {array._type_.__name__}, not {element_type.__name__}"
    if len(array) < len(values):
        _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for slot, value in enumerate(values):
        array[slot] = value
    count.contents.value = len(values)
    return int(pynvml.NVML_SUCCESS)


def _gpu_instance_handle(gpu_instance_id: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(0x1000 + gpu_instance_id), pynvml.c_nvmlGpuInstance_t)


def _compute_instance_handle(gpu_instance_id: int, compute_instance_id: int) -> Any:
    address = 0x100000 + gpu_instance_id * 0x100 + compute_instance_id
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlComputeInstance_t)


def _address(handle: Any) -> int:
    address = ctypes.cast(handle, ctypes.c_void_p).value
    assert address is not None
    return address


class ScriptedNvml:
    """One A100-SXM4-40GB as NVML shows it; each `nvml*` method stands in for pynvml's function."""

    def __init__(self) -> None:
        self.mig_mode: int | None = ENABLE  # None: a GPU without MIG
        self.placements_need_mig_enabled = False  # how drivers before about R550 answered
        self.fabric: ScriptedFabric | None = None  # None: not in an NVLink fabric
        self.gpu_instances: dict[int, ScriptedGpuInstance] = {}
        # function name -> the NVML error code it answers every call with
        self.failures: dict[str, int] = {}
        # (function name, name of the thread it was called on)
        self.calls: list[tuple[str, str]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._recorded(name, getattr(self, name)))

    def _recorded(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, threading.current_thread().name))
            if name in self.failures:
                _fail(self.failures[name])
            return method(*args)

        return call

    def called(self) -> list[str]:
        return [name for name, _thread in self.calls]

    def add_gpu_instance(
        self, profile_id: int, start: int, compute_slices: tuple[int, ...] | None = None
    ) -> int:
        """A GPU instance as `nvidia-smi mig -cgi` leaves it: with one compute instance per entry of
        `compute_slices` (by default one spanning it; () for none)."""
        profile = self._profile(profile_id)
        placement = next(place for place in profile.placements if place[0] == start)
        gpu_instance_id = next(number for number in itertools.count(1) if number not in self.gpu_instances)
        instance = ScriptedGpuInstance(gpu_instance_id, profile, placement)
        each = (profile.slices,) if compute_slices is None else compute_slices
        for compute_instance, slices in enumerate(each):
            constant = next(constant for constant, size in CI_SLICES.items() if size == slices)
            instance.compute_instances[compute_instance] = CI_ID_OFFSET + constant
        self.gpu_instances[gpu_instance_id] = instance
        return gpu_instance_id

    def _gpu(self, handle: object) -> None:
        assert handle is GPU_HANDLE, f"expected the GPU's handle, got {handle!r}"

    def _profile(self, profile_id: int) -> ScriptedProfile:
        found = next((profile for profile in A100_PROFILES if profile.profile_id == profile_id), None)
        if found is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def _gpu_instance(self, handle: Any) -> ScriptedGpuInstance:
        assert isinstance(handle, pynvml.c_nvmlGpuInstance_t)
        instance = self.gpu_instances.get(_address(handle) - 0x1000)
        if instance is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return instance

    def _compute_instance(self, handle: Any) -> tuple[ScriptedGpuInstance, int]:
        assert isinstance(handle, pynvml.c_nvmlComputeInstance_t)
        gpu_instance_id, compute_instance_id = divmod(_address(handle) - 0x100000, 0x100)
        instance = self.gpu_instances.get(gpu_instance_id)
        if instance is None or compute_instance_id not in instance.compute_instances:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return instance, compute_instance_id

    def _mig_devices(self) -> dict[int, MigDevice]:
        # Indices are sparse on purpose: index 0 has no device behind it.
        devices = [
            MigDevice(instance.id, compute_instance)
            for instance in sorted(self.gpu_instances.values(), key=lambda instance: instance.id)
            for compute_instance in sorted(instance.compute_instances)
        ]
        return {index + 1: device for index, device in enumerate(devices)}

    # Whole-GPU facts.
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if index != 0:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return GPU_HANDLE

    def nvmlDeviceGetHandleByUUID(self, gpu_uuid: str) -> object:
        if gpu_uuid != GPU_UUID:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return GPU_HANDLE

    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        self._gpu(handle)
        return 8, 0

    def nvmlDeviceGetAttributes(self, handle: object) -> Any:
        self._gpu(handle)
        return _struct(pynvml.c_nvmlDeviceAttributes, multiprocessorCount=108)

    def nvmlDeviceGetPciInfo(self, handle: object) -> Any:
        self._gpu(handle)
        return _struct(pynvml.nvmlPciInfo_t, busId=b"00000000:07:00.0")

    def nvmlDeviceGetBrand(self, handle: object) -> int:
        self._gpu(handle)
        return int(pynvml.NVML_BRAND_NVIDIA)

    def nvmlDeviceGetArchitecture(self, handle: object) -> int:
        self._gpu(handle)
        return int(pynvml.NVML_DEVICE_ARCH_AMPERE)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
        self._gpu(handle)
        return _struct(pynvml.c_nvmlMemory_t, total=MEMORY_MIB * MIB)

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        if isinstance(handle, MigDevice):
            return mig_uuid(*handle)
        self._gpu(handle)
        return GPU_UUID

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        self._gpu(handle)
        return 0

    def nvmlDeviceGetName(self, handle: object) -> str:
        self._gpu(handle)
        return "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetGpuFabricInfoV(self, handle: object, info: Any) -> int:
        self._gpu(handle)
        if self.fabric is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        target = info.contents
        assert target.version == pynvml.nvmlGpuFabricInfo_v2
        target.state = self.fabric.state
        target.status = self.fabric.status
        target.cliqueId = self.fabric.clique_id
        target.clusterUuid = (ctypes.c_uint8 * 16)(*self.fabric.cluster_uuid)
        return int(pynvml.NVML_SUCCESS)

    # MIG queries.
    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        self._gpu(handle)
        if self.mig_mode is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [self.mig_mode, self.mig_mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: object, constant: int) -> Any:
        self._gpu(handle)
        profile = next((profile for profile in A100_PROFILES if profile.nvml_enum == constant), None)
        if self.mig_mode is None or (
            profile is None and constant < pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
        ):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if profile is None:  # constants newer than this (scripted) driver
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        copy, decoders, encoders, jpeg, ofa = profile.engines
        return _struct(
            pynvml.c_nvmlGpuInstanceProfileInfo_v2_t,
            id=profile.profile_id,
            sliceCount=profile.slices,
            instanceCount=profile.instances,
            multiprocessorCount=profile.slices * MULTIPROCESSORS_PER_SLICE,
            copyEngineCount=copy,
            decoderCount=decoders,
            encoderCount=encoders,
            jpegCount=jpeg,
            ofaCount=ofa,
            memorySizeMB=profile.memory_mib,
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: object, profile_id: int, placements: Any, count: Any
    ) -> int:
        self._gpu(handle)
        if self.placements_need_mig_enabled and self.mig_mode != ENABLE:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(profile_id)
        if placements is None:
            count.contents.value = len(profile.placements)
            return int(pynvml.NVML_SUCCESS)
        values = [pynvml.c_nvmlGpuInstancePlacement_t(*place) for place in profile.placements]
        return _fill(placements, pynvml.c_nvmlGpuInstancePlacement_t, values, count)

    def nvmlDeviceGetGpuInstances(self, handle: object, profile_id: int, instances: Any, count: Any) -> int:
        self._gpu(handle)
        self._profile(profile_id)
        found = [
            _gpu_instance_handle(instance.id)
            for instance in self.gpu_instances.values()
            if instance.profile.profile_id == profile_id
        ]
        return _fill(instances, pynvml.c_nvmlGpuInstance_t, found, count)

    def nvmlGpuInstanceGetInfo(self, handle: Any) -> Any:
        instance = self._gpu_instance(handle)
        return _struct(
            pynvml.c_nvmlGpuInstanceInfo_t,
            id=instance.id,
            profileId=instance.profile.profile_id,
            placement=pynvml.c_nvmlGpuInstancePlacement_t(*instance.placement),
        )

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle: Any, constant: int, engines: int) -> Any:
        instance = self._gpu_instance(handle)
        assert engines == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        if constant >= pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = CI_SLICES.get(constant)
        if slices is None or slices > instance.profile.slices:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _struct(
            pynvml.c_nvmlComputeInstanceProfileInfo_v2_t,
            id=CI_ID_OFFSET + constant,
            sliceCount=slices,
            instanceCount=instance.profile.slices // slices,
            multiprocessorCount=slices * MULTIPROCESSORS_PER_SLICE,
        )

    def nvmlGpuInstanceGetComputeInstances(
        self, handle: Any, profile_id: int, instances: Any, count: Any
    ) -> int:
        instance = self._gpu_instance(handle)
        found = [
            _compute_instance_handle(instance.id, compute_instance)
            for compute_instance, compute_profile in sorted(instance.compute_instances.items())
            if compute_profile == profile_id
        ]
        return _fill(instances, pynvml.c_nvmlComputeInstance_t, found, count)

    def nvmlComputeInstanceGetInfo(self, handle: Any) -> Any:
        instance, compute_instance = self._compute_instance(handle)
        return _struct(
            pynvml.c_nvmlComputeInstanceInfo_t,
            id=compute_instance,
            profileId=instance.compute_instances[compute_instance],
        )

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        self._gpu(handle)
        return 7 if self.mig_mode == ENABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> MigDevice:
        self._gpu(handle)
        device = self._mig_devices().get(index)
        if device is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return device

    def nvmlDeviceGetGpuInstanceId(self, device: MigDevice) -> int:
        return device.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: MigDevice) -> int:
        return device.compute_instance_id

    # MIG changes.
    def nvmlDeviceGetGpuInstanceById(self, handle: object, gpu_instance_id: int) -> Any:
        self._gpu(handle)
        if gpu_instance_id > 14:  # beyond any id the GPU hands out
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu_instance_id not in self.gpu_instances:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _gpu_instance_handle(gpu_instance_id)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: object, profile_id: int, placement: Any
    ) -> Any:
        self._gpu(handle)
        if self.mig_mode != ENABLE:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(profile_id)
        assert isinstance(placement.contents, pynvml.c_nvmlGpuInstancePlacement_t)
        wanted = (placement.contents.start, placement.contents.size)
        if wanted not in profile.placements:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        taken = {
            memory_slice
            for instance in self.gpu_instances.values()
            for memory_slice in range(instance.placement[0], sum(instance.placement))
        }
        if taken & set(range(wanted[0], sum(wanted))):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gpu_instance_id = self.add_gpu_instance(profile_id, wanted[0], compute_slices=())
        return _gpu_instance_handle(gpu_instance_id)

    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile_id: int) -> Any:
        instance = self._gpu_instance(handle)
        slices = CI_SLICES.get(profile_id - CI_ID_OFFSET)
        if slices is None or slices > instance.profile.slices:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        used = sum(CI_SLICES[used_id - CI_ID_OFFSET] for used_id in instance.compute_instances.values())
        if used + slices > instance.profile.slices:
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        compute_instance = next(
            number for number in itertools.count() if number not in instance.compute_instances
        )
        instance.compute_instances[compute_instance] = profile_id
        return _compute_instance_handle(instance.id, compute_instance)

    def nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        instance, compute_instance = self._compute_instance(handle)
        del instance.compute_instances[compute_instance]
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        instance = self._gpu_instance(handle)
        if instance.compute_instances:
            _fail(pynvml.NVML_ERROR_IN_USE)
        del self.gpu_instances[instance.id]
        return int(pynvml.NVML_SUCCESS)


def make_sysfs(root: Path, numa_node: str | None = "1\n") -> Path:
    """/sys/bus/pci/devices with the scripted GPU in it, linked under root complex pci0000:00."""
    device = root / "devices" / "pci0000:00" / "0000:00:01.0" / BUS_ID
    device.mkdir(parents=True)
    if numa_node is not None:
        (device / "numa_node").write_text(numa_node)
    bus = root / "bus"
    bus.mkdir()
    (bus / BUS_ID).symlink_to(device)
    return bus


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ScriptedNvml:
    scripted = ScriptedNvml()
    scripted.install(monkeypatch)
    # No library is loaded: the script stands in for everything behind pynvml.
    monkeypatch.setattr("dra_driver.hardware.nvml.load_nvml_library", lambda _root: "scripted")
    return scripted


@pytest.fixture
async def backend(nvml: ScriptedNvml, tmp_path: Path) -> AsyncIterator[NvmlBackend]:
    backend = NvmlBackend(sysfs_devices=make_sysfs(tmp_path))
    yield backend
    await backend.close()


async def discover_one(backend: NvmlBackend) -> Gpu:
    gpus = await backend.discover()
    assert len(gpus) == 1
    return gpus[0]


@WITHOUT_HOST_NVML
def test_a_missing_nvml_library_is_a_clear_hardware_error(tmp_path: Path) -> None:
    """In a process of its own: once any test has loaded a libnvidia-ml.so.1, the loader finds it
    by name for the rest of the process."""
    script = (
        "import asyncio, pathlib, sys\n"
        "from dra_driver.hardware.model import HardwareError\n"
        "from dra_driver.hardware.nvml import NvmlBackend\n"
        "backend = NvmlBackend(driver_root=pathlib.Path(sys.argv[1]))\n"
        "try:\n"
        "    asyncio.run(backend.discover())\n"
        "except HardwareError as error:\n"
        "    print(error.reason.value, error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], check=False, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"library-not-found libnvidia-ml.so.1 not found under driver root {tmp_path} "
        "(--driver-root, DRA_DRIVER_ROOT); tried: "
    )
    assert f"{tmp_path}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 (absent)" in done.stdout
    assert "the default library search path (libnvidia-ml.so.1 by name) (cannot be loaded" in done.stdout


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, HardwareErrorReason.INVALID_ARGUMENT),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, HardwareErrorReason.NOT_SUPPORTED),
        (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, HardwareErrorReason.INSUFFICIENT_RESOURCES),
        (pynvml.NVML_ERROR_NOT_FOUND, HardwareErrorReason.NOT_FOUND),
        (pynvml.NVML_ERROR_GPU_IS_LOST, HardwareErrorReason.GPU_LOST),
        (pynvml.NVML_ERROR_NO_PERMISSION, HardwareErrorReason.NO_PERMISSION),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, HardwareErrorReason.LIBRARY_NOT_FOUND),
        (pynvml.NVML_ERROR_TIMEOUT, HardwareErrorReason.OTHER),
        (pynvml.NVML_ERROR_IN_USE, HardwareErrorReason.OTHER),
    ],
)
def test_each_nvml_error_has_its_reason(code: int, reason: HardwareErrorReason) -> None:
    with pytest.raises(HardwareError) as raised:
        nvml_call("nvmlDeviceGetSomething for GPU 3", _fail, code)
    assert raised.value.reason is reason
    assert str(raised.value).startswith(
        f"NVML nvmlDeviceGetSomething for GPU 3 failed: {pynvml.NVMLError(code)}"
    )


async def test_a_mig_disabled_gpu_reports_its_profiles_and_no_instances(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    nvml.mig_mode = DISABLE
    gpu = await discover_one(backend)

    assert (gpu.uuid, gpu.product_name, gpu.brand, gpu.architecture) == (
        GPU_UUID,
        "NVIDIA A100-SXM4-40GB",
        "Nvidia",
        "Ampere",
    )
    assert (gpu.pci_bus_id, gpu.pcie_root, gpu.numa_node) == (BUS_ID, "pci0000:00", 1)
    assert (gpu.memory_bytes, gpu.cuda_compute_capability, gpu.cuda_driver_version) == (
        MEMORY_MIB * MIB,
        "8.0",
        "13.0",
    )
    assert gpu.mig_mode is MigMode.DISABLED
    assert gpu.memory_slices == 8
    assert [(profile.name, profile.profile_id, profile.nvml_enum) for profile in gpu.mig_profiles] == [
        ("1g.5gb", 19, 0),
        ("1g.5gb+me", 20, 7),
        ("3g.20gb", 9, 2),
        ("7g.40gb", 0, 4),
    ]
    assert gpu.mig_profile(20) == MigProfile(
        profile_id=20,
        nvml_enum=pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
        name="1g.5gb+me",
        compute_slices=1,
        memory_bytes=4864 * MIB,
        multiprocessors=14,
        copy_engines=1,
        decoders=1,
        encoders=0,
        jpeg_engines=1,
        ofa_engines=1,
        max_instances=1,
        placements=tuple(Placement(start, 1) for start in range(7)),
    )
    three_slices = gpu.mig_profile(9)
    assert three_slices is not None
    assert three_slices.placements == (Placement(0, 4), Placement(4, 4))
    assert gpu.mig_instances == ()
    assert gpu.fabric_clique is None


async def test_a_mig_enabled_gpu_reports_each_compute_instance_with_its_uuid(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    bare = nvml.add_gpu_instance(19, start=0, compute_slices=())
    small = nvml.add_gpu_instance(19, start=1)
    split = nvml.add_gpu_instance(9, start=4, compute_slices=(1, 2))

    gpu = await discover_one(backend)

    assert gpu.mig_mode is MigMode.ENABLED
    assert gpu.memory_slices == 8
    assert gpu.mig_instances == (
        MigInstance(
            uuid="",
            profile_id=19,
            placement=Placement(0, 1),
            gpu_instance_id=bare,
            compute_instance_id=-1,
            compute_slices=0,
            multiprocessors=0,
        ),
        MigInstance(
            uuid=mig_uuid(small, 0),
            profile_id=19,
            placement=Placement(1, 1),
            gpu_instance_id=small,
            compute_instance_id=0,
            compute_slices=1,
            multiprocessors=14,
        ),
        MigInstance(
            uuid=mig_uuid(split, 0),
            profile_id=9,
            placement=Placement(4, 4),
            gpu_instance_id=split,
            compute_instance_id=0,
            compute_slices=1,
            multiprocessors=14,
        ),
        MigInstance(
            uuid=mig_uuid(split, 1),
            profile_id=9,
            placement=Placement(4, 4),
            gpu_instance_id=split,
            compute_instance_id=1,
            compute_slices=2,
            multiprocessors=28,
        ),
    )


async def test_a_gpu_without_mig_has_no_profiles(nvml: ScriptedNvml, backend: NvmlBackend) -> None:
    nvml.mig_mode = None
    gpu = await discover_one(backend)

    assert gpu.mig_mode is MigMode.UNSUPPORTED
    assert (gpu.mig_profiles, gpu.memory_slices, gpu.mig_instances) == ((), 0, ())
    assert "nvmlDeviceGetGpuInstanceProfileInfo" not in nvml.called()


async def test_placements_refused_while_mig_is_off_leave_the_profiles_without_any(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    nvml.mig_mode = DISABLE
    nvml.placements_need_mig_enabled = True
    gpu = await discover_one(backend)

    assert len(gpu.mig_profiles) == 4
    assert all(profile.placements == () for profile in gpu.mig_profiles)
    assert gpu.memory_slices == 0


async def test_an_nvml_error_during_discovery_names_the_call_and_the_gpu(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    nvml.add_gpu_instance(9, start=0)
    nvml.failures["nvmlGpuInstanceGetInfo"] = pynvml.NVML_ERROR_NO_PERMISSION

    with pytest.raises(HardwareError) as raised:
        await discover_one(backend)
    assert str(raised.value) == "NVML nvmlGpuInstanceGetInfo for GPU 0 failed: Insufficient Permissions"
    assert raised.value.reason is HardwareErrorReason.NO_PERMISSION


async def test_a_gpu_lost_during_discovery_is_left_out(nvml: ScriptedNvml, backend: NvmlBackend) -> None:
    nvml.failures["nvmlDeviceGetPciInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST

    assert await backend.discover() == ()


@pytest.mark.parametrize(("content", "node"), [("1\n", 1), ("0\n", 0), ("-1\n", None), (None, None)])
def test_the_numa_node_comes_from_sysfs(tmp_path: Path, content: str | None, node: int | None) -> None:
    assert numa_node_of(BUS_ID, make_sysfs(tmp_path, content)) == node


def test_an_unreadable_numa_node_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match=r"numa_node holds 'node1', not a NUMA node number"):
        numa_node_of(BUS_ID, make_sysfs(tmp_path, "node1\n"))


CLUSTER = uuid.UUID("0B2F6A3C-1D4E-4F5A-9B8C-7D6E5F4A3B2C")


async def test_a_registered_fabric_gpu_reports_its_clique(nvml: ScriptedNvml, backend: NvmlBackend) -> None:
    nvml.fabric = ScriptedFabric(
        pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, CLUSTER.bytes, 32766
    )
    assert (await discover_one(backend)).fabric_clique == "0b2f6a3c-1d4e-4f5a-9b8c-7d6e5f4a3b2c.32766"


@pytest.mark.parametrize(
    "fabric",
    [
        ScriptedFabric(pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS, CLUSTER.bytes, 1),
        ScriptedFabric(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_NOT_READY, CLUSTER.bytes, 1),
        ScriptedFabric(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, bytes(16), 1),
    ],
    ids=["registering", "failed", "no-cluster"],
)
async def test_an_unfinished_fabric_registration_has_no_clique(
    nvml: ScriptedNvml, backend: NvmlBackend, fabric: ScriptedFabric
) -> None:
    nvml.fabric = fabric
    assert (await discover_one(backend)).fabric_clique is None


async def test_creating_a_mig_instance_returns_it_with_its_uuid(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    created = await backend.create_mig_instance(GPU_UUID, 9, Placement(4, 4))

    assert created == MigInstance(
        uuid=mig_uuid(1, 0),
        profile_id=9,
        placement=Placement(4, 4),
        gpu_instance_id=1,
        compute_instance_id=0,
        compute_slices=3,
        multiprocessors=42,
    )
    assert (await discover_one(backend)).mig_instances == (created,)


async def test_every_nvml_call_runs_on_the_nvml_thread(nvml: ScriptedNvml, backend: NvmlBackend) -> None:
    created = await backend.create_mig_instance(GPU_UUID, 0, Placement(0, 8))
    await discover_one(backend)
    await backend.destroy_mig_instance(GPU_UUID, created.gpu_instance_id)

    threads = {thread for _name, thread in nvml.calls}
    assert len(nvml.calls) > 50
    assert len(threads) == 1
    assert threads.pop().startswith("nvml_")


@pytest.mark.parametrize(
    ("mig_mode", "profile_id", "placement", "reason"),
    [
        (ENABLE, 9, Placement(0, 4), HardwareErrorReason.INSUFFICIENT_RESOURCES),  # overlaps the 1g at 0
        (ENABLE, 9, Placement(2, 4), HardwareErrorReason.INVALID_ARGUMENT),  # not a 3g placement
        (ENABLE, 42, Placement(0, 1), HardwareErrorReason.INVALID_ARGUMENT),  # no such profile
        (DISABLE, 19, Placement(1, 1), HardwareErrorReason.NOT_SUPPORTED),
        (None, 19, Placement(1, 1), HardwareErrorReason.NOT_SUPPORTED),
    ],
    ids=["overlap", "bad-placement", "unknown-profile", "mig-off", "no-mig"],
)
async def test_a_refused_creation_says_why_and_changes_nothing(
    nvml: ScriptedNvml,
    backend: NvmlBackend,
    mig_mode: int | None,
    profile_id: int,
    placement: Placement,
    reason: HardwareErrorReason,
) -> None:
    nvml.add_gpu_instance(19, start=0)
    nvml.mig_mode = mig_mode

    with pytest.raises(HardwareError) as raised:
        await backend.create_mig_instance(GPU_UUID, profile_id, placement)
    assert raised.value.reason is reason
    assert GPU_UUID in str(raised.value)
    assert list(nvml.gpu_instances) == [1]


async def test_a_failed_compute_instance_removes_the_new_gpu_instance(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    nvml.failures["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES

    with pytest.raises(HardwareError) as raised:
        await backend.create_mig_instance(GPU_UUID, 9, Placement(4, 4))
    assert raised.value.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES
    assert str(raised.value).startswith(
        f"NVML nvmlGpuInstanceCreateComputeInstance(profile {CI_ID_OFFSET + 2}) "
        f"for GPU {GPU_UUID} GPU instance 1 failed"
    )
    assert "nvmlGpuInstanceDestroy" in nvml.called()
    assert nvml.gpu_instances == {}


async def test_a_failed_rollback_is_noted_on_the_error(nvml: ScriptedNvml, backend: NvmlBackend) -> None:
    nvml.failures["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    nvml.failures["nvmlGpuInstanceDestroy"] = pynvml.NVML_ERROR_UNKNOWN

    with pytest.raises(HardwareError) as raised:
        await backend.create_mig_instance(GPU_UUID, 9, Placement(4, 4))
    assert raised.value.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES
    (note,) = raised.value.__notes__
    assert note.startswith(
        "the new GPU instance could not be removed and is left behind: NVML nvmlGpuInstanceDestroy"
    )
    assert list(nvml.gpu_instances) == [1]


async def test_destroying_a_mig_instance_removes_its_compute_instances_first(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    kept = nvml.add_gpu_instance(19, start=0)
    removed = nvml.add_gpu_instance(9, start=4)

    await backend.destroy_mig_instance(GPU_UUID, removed)

    assert list(nvml.gpu_instances) == [kept]
    called = nvml.called()
    assert called.index("nvmlComputeInstanceDestroy") < called.index("nvmlGpuInstanceDestroy")


@pytest.mark.parametrize("gpu_instance_id", [5, 99], ids=["unused-id", "impossible-id"])
async def test_destroying_an_unknown_gpu_instance_is_not_found(
    nvml: ScriptedNvml, backend: NvmlBackend, gpu_instance_id: int
) -> None:
    nvml.add_gpu_instance(9, start=0)
    with pytest.raises(HardwareError) as raised:
        await backend.destroy_mig_instance(GPU_UUID, gpu_instance_id)
    assert raised.value.reason is HardwareErrorReason.NOT_FOUND
    assert str(raised.value).startswith(f"GPU instance {gpu_instance_id} does not exist on GPU {GPU_UUID}")
    assert list(nvml.gpu_instances) == [1]


@pytest.mark.parametrize(
    ("nvml_bus_id", "sysfs"), [("00000000:18:00.0", "0000:18:00.0"), ("00000001:AB:00.0", "0001:ab:00.0")]
)
def test_bus_ids_use_the_sysfs_form(nvml_bus_id: str, sysfs: str) -> None:
    assert normalize_bus_id(nvml_bus_id) == sysfs


def test_the_pcie_root_comes_from_the_device_sysfs_path(tmp_path: Path) -> None:
    device_dir = tmp_path / "devices" / "pci0000:15" / "0000:15:01.0" / "0000:18:00.0"
    device_dir.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:18:00.0").symlink_to(device_dir)

    assert pcie_root_of("0000:18:00.0", bus) == "pci0000:15"


def test_a_device_outside_any_pcie_root_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "0000:18:00.0").mkdir()
    with pytest.raises(HardwareError, match=r"cannot find the PCIe root of GPU 0000:18:00\.0"):
        pcie_root_of("0000:18:00.0", tmp_path)


def test_a_missing_sysfs_entry_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match=r"cannot find GPU 0000:18:00\.0 under .*: is /sys mounted"):
        pcie_root_of("0000:18:00.0", tmp_path)


async def test_a_gpu_that_refuses_attributes_gets_its_sm_count_from_the_catalog(
    nvml: ScriptedNvml, backend: NvmlBackend
) -> None:
    nvml.failures["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert (await discover_one(backend)).multiprocessors == 108

    nvml.failures["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(HardwareError, match="nvmlDeviceGetAttributes for GPU 0 failed"):
        await discover_one(backend)
