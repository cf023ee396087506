"""The NVML path below nvidia-ml-py, on the mock libnvidia-ml.so.1: which C functions the driver
reaches, how the library is found under a driver root, and what outlives a process.

Every pynvml function the driver's hardware code names must be exported by the mock and reached
by a run of the driver's NVML code over it; adding a call without mock support fails here.
"""

import asyncio
import ctypes
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from dra_driver.hardware.model import HardwareError, MigMode, Placement
from dra_driver.hardware.nvml import NvmlBackend
from dra_driver.hardware.nvml_events import NvmlEvents
from dra_driver.hardware.nvml_library import (
    LIBRARY,
    cached_library_paths,
    candidate_paths,
    load_nvml_library,
)
from dra_driver.hardware.nvml_usage import NvmlUsageReader
from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from dra_driver.hardware.usage import DeviceUsage
from tests.support.mock_nvml import WITHOUT_HOST_NVML, MockNode, build_library, make_driver_root

HARDWARE_CODE = Path(__file__).resolve().parents[2] / "dra_driver" / "hardware"
NODE = "contract-node"


def driver_pynvml_functions() -> set[str]:
    """The pynvml functions the driver's hardware modules call (constants left out)."""
    names = {
        name
        for path in HARDWARE_CODE.glob("*.py")
        for name in re.findall(r"pynvml\.(nvml\w+)", path.read_text())
    }
    return {name for name in names if inspect.isfunction(getattr(pynvml, name))}


def c_symbols(function_name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The C functions a pynvml function asks the library for, following the pynvml functions it
    hands over to (nvmlInit -> nvmlInitWithFlags, nvmlDeviceGetPciInfo -> ..._v3)."""
    source = inspect.getsource(getattr(pynvml, function_name))
    symbols = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    for called in re.findall(r"^\s+(?:return )?(nvml\w+)\(", source, re.MULTILINE):
        if (
            called != function_name
            and called not in seen
            and inspect.isfunction(getattr(pynvml, called, None))
        ):
            symbols |= c_symbols(called, seen | {function_name})
    return symbols


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_driver_root(tmp_path_factory.mktemp("root"), DEFAULT_DRIVER_VERSION)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MockNode:
    made = MockNode.create(tmp_path / "node", NODE, "mixed")
    for name, value in made.environment().items():
        monkeypatch.setenv(name, value)
    return made


async def exercise(backend: NvmlBackend, node: MockNode) -> None:
    """Everything the agent does with NVML: discovery, MIG changes and a rolled-back one, and
    events."""
    gpus = await backend.discover()
    gpu = next(g for g in gpus if g.mig_mode is MigMode.ENABLED and not g.mig_instances)
    profile = gpu.mig_profiles[0]
    created = await backend.create_mig_instance(gpu.uuid, profile.profile_id, profile.placements[0])
    await backend.destroy_mig_instance(gpu.uuid, created.gpu_instance_id)
    await backend.set_compute_mode(gpus[0].uuid, "ExclusiveProcess")
    assert await backend.compute_mode(gpus[0].uuid) == "ExclusiveProcess"
    await backend.set_compute_mode(gpus[0].uuid, "Default")
    node.fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(Exception, match="Insufficient resources"):
        await backend.create_mig_instance(gpu.uuid, profile.profile_id, profile.placements[0])
    events = NvmlEvents(wait_ms=50)
    events.start()
    node.xid(0, 13)
    await asyncio.wait_for(anext(events), 10)
    node.lose(1)
    await asyncio.wait_for(anext(events), 10)
    await events.stop()
    await backend.close()


GIB = 2**30


def read_usage(node: MockNode, driver_root: Path) -> tuple[DeviceUsage, ...]:
    """What the usage sampler reads: a process on static MIG instance 2 of GPU 0 (placement 4 in
    the mixed profile's boot layout) and two on whole GPU 6, one with an SM sample."""
    node.run_processes([(0, 2, 0, 501, GIB), (6, -1, -1, 601, 3 * GIB), (6, -1, -1, 602, GIB)])
    node.set_utilization({6: 77})
    node.set_process_utilization([(6, 601, 40)])
    reader = NvmlUsageReader(driver_root)
    try:
        return reader.read_usage()
    finally:
        reader.close()


def test_usage_is_read_per_gpu_and_per_mig_device(node: MockNode, driver_root: Path) -> None:
    usage = read_usage(node, driver_root)

    gpus = [u for u in usage if u.mig_uuid is None]
    assert len(gpus) == 8
    gpu6 = gpus[6]
    assert (gpu6.memory_used_bytes, gpu6.utilization_percent) == (4 * GIB, 77.0)
    assert {(p.pid, p.memory_bytes, p.sm_percent) for p in gpu6.processes} == {
        (601, 3 * GIB, 40.0),
        (602, GIB, None),
    }
    (mig,) = [u for u in usage if u.mig_uuid is not None and u.processes]
    assert mig.gpu_uuid == gpus[0].gpu_uuid
    assert mig.utilization_percent is None  # NVML has none for MIG devices
    assert (mig.memory_used_bytes, [p.pid for p in mig.processes]) == (GIB, [501])
    assert mig.mig_placement_start is not None
    assert mig.memory_total_bytes < gpus[0].memory_total_bytes


async def test_every_nvml_call_of_the_driver_is_in_the_mock_and_reached(
    node: MockNode, driver_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("MOCK_NVML_CALLS", str(calls))
    await exercise(NvmlBackend(node.pci_devices, driver_root), node)
    read_usage(node, driver_root)
    # The fabric call answers only on GPUs in an NVLink domain.
    fabric = MockNode.create(tmp_path / "fabric", NODE, "gb200x4")
    for name, value in fabric.environment().items():
        monkeypatch.setenv(name, value)
    backend = NvmlBackend(fabric.pci_devices, driver_root)
    assert all(gpu.fabric_clique for gpu in await backend.discover())
    await backend.close()

    mock = ctypes.CDLL(str(build_library()))
    reached = set(calls.read_text().split())
    functions = driver_pynvml_functions()
    assert len(functions) >= 35, sorted(functions)
    symbols = {function: c_symbols(function) for function in functions}
    missing = {f: sorted(s) for f, s in symbols.items() if not all(hasattr(mock, name) for name in s)}
    unreached = sorted(f for f, s in symbols.items() if not s & reached)
    assert missing == {}, "pynvml functions whose C symbols the mock lacks"
    assert unreached == [], "pynvml functions the driver calls that no test reached on the mock"


async def test_a_compute_mode_set_stays_with_the_gpu_across_processes_until_set_back(
    node: MockNode, driver_root: Path
) -> None:
    async def set_then_read_anew() -> None:
        backend = NvmlBackend(node.pci_devices, driver_root)
        gpus = await backend.discover()
        assert [await backend.compute_mode(gpu.uuid) for gpu in gpus] == ["Default"] * len(gpus)
        await backend.set_compute_mode(gpus[1].uuid, "ExclusiveProcess")
        await backend.close()
        # A new process (the mock reloads from its state file on nvmlInit; here: after the
        # state file is read again by a library instance with no memory of the change).
        assert "cm 1 3" in node.state_file.read_text().split("\n")
        again = NvmlBackend(node.pci_devices, driver_root)
        assert await again.compute_mode(gpus[1].uuid) == "ExclusiveProcess"
        await again.set_compute_mode(gpus[1].uuid, "Default")
        assert await again.compute_mode(gpus[1].uuid) == "Default"
        with pytest.raises(HardwareError, match="nvmlDeviceGetHandleByUUID GPU-00000000"):
            await again.compute_mode("GPU-00000000-0000-0000-0000-000000000000")
        await again.close()

    await set_then_read_anew()


async def test_a_function_the_library_lacks_is_function_not_found(node: MockNode, driver_root: Path) -> None:
    backend = NvmlBackend(node.pci_devices, driver_root)
    await backend.discover()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError) as raised:
            pynvml.nvmlDeviceGetPowerUsage(handle)
        assert raised.value.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    finally:
        await backend.close()


async def test_a_structure_of_another_version_is_refused(node: MockNode, driver_root: Path) -> None:
    backend = NvmlBackend(node.pci_devices, driver_root)
    await backend.discover()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.version = 0x01000098
        # The library nvidia-ml-py loaded: another copy of the file would be another library.
        function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
        assert function(handle, 0, ctypes.byref(info)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    finally:
        await backend.close()


def inspect_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "dra_driver", "inspect", "--node-name", NODE, "--hardware", "nvml", *extra]


async def test_mig_instances_outlive_the_process_that_made_them(node: MockNode, driver_root: Path) -> None:
    backend = NvmlBackend(node.pci_devices, driver_root)
    gpu = next(g for g in await backend.discover() if g.mig_mode is MigMode.ENABLED and not g.mig_instances)
    created = await backend.create_mig_instance(gpu.uuid, 0, Placement(0, 8))
    await backend.close()

    shown = await asyncio.to_thread(
        subprocess.run,
        inspect_command("--driver-root", str(driver_root), "--sysfs-root", str(node.sysfs)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert shown.returncode == 0, shown.stderr
    assert f"hardware: NVML (nvidia-ml-py, {driver_root}/usr/lib/x86_64-linux-gnu/" in shown.stdout
    assert "7g.80gb" in shown.stdout
    assert created.uuid.startswith("MIG-")


@WITHOUT_HOST_NVML
def test_inspect_without_a_driver_lists_where_it_looked(tmp_path: Path) -> None:
    shown = subprocess.run(
        inspect_command("--driver-root", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert shown.returncode == 1
    (line,) = shown.stderr.splitlines()
    assert line.startswith(
        f"dra-driver inspect: --hardware nvml: {LIBRARY} not found under driver root {tmp_path} "
        "(--driver-root, DRA_DRIVER_ROOT); tried: "
    )
    for directory in ("usr/lib/x86_64-linux-gnu", "usr/lib64", "lib64", "usr/lib/aarch64-linux-gnu"):
        assert f"{tmp_path}/{directory}/{LIBRARY} (absent)" in line


def test_the_library_is_found_through_the_roots_loader_cache(tmp_path: Path) -> None:
    """A driver in a directory only the root's ld.so.cache knows, as ldconfig writes it."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    library_dir = tmp_path / "opt" / "nvidia" / "lib"
    library_dir.mkdir(parents=True)
    shutil.copyfile(build_library(), library_dir / LIBRARY)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ld.so.conf").write_text("/opt/nvidia/lib\n")
    made = subprocess.run(
        [ldconfig, "-r", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert made.returncode == 0, made.stderr

    cache = (tmp_path / "etc" / "ld.so.cache").read_bytes()

    assert cached_library_paths(cache) == [f"/opt/nvidia/lib/{LIBRARY}"]
    assert candidate_paths(tmp_path)[0] == f"/opt/nvidia/lib/{LIBRARY}"
    assert load_nvml_library(tmp_path) == str(library_dir / LIBRARY)
    assert cached_library_paths(b"not a loader cache\0/opt/nvidia/lib/libnvidia-ml.so.1\0") == []


async def test_a_mig_instance_with_a_process_on_it_is_in_use(node: MockNode, driver_root: Path) -> None:
    backend = NvmlBackend(node.pci_devices, driver_root)
    gpu = (await backend.discover())[0]
    instance = gpu.mig_instances[0]
    node.run_processes([(0, instance.gpu_instance_id, instance.compute_instance_id, 4242, 2**30)])
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
        on_gpu = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        on_mig = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
        with pytest.raises(HardwareError) as raised:
            await backend.destroy_mig_instance(gpu.uuid, instance.gpu_instance_id)
        after = (await backend.discover())[0]
    finally:
        await backend.close()

    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in on_gpu] == [(4242, 2**30, 1)]
    assert [p.pid for p in on_mig] == [4242]
    assert str(raised.value).startswith(f"NVML nvmlComputeInstanceDestroy for GPU {gpu.uuid} GPU instance 1")
    assert str(raised.value).endswith("failed: In use by another client")
    assert after == gpu


async def test_the_calls_beside_the_drivers_answer_like_the_ones_it_uses(
    node: MockNode, driver_root: Path
) -> None:
    """The older and newer variants the mock also exports, through nvidia-ml-py, so that a driver
    change to one of them meets the same node."""
    backend = NvmlBackend(node.pci_devices, driver_root)
    gpus = await backend.discover()
    try:
        empty = next(g for g in gpus if g.mig_mode is MigMode.ENABLED and not g.mig_instances)
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(empty.pci_bus_id)
        assert pynvml.nvmlDeviceGetUUID(handle) == empty.uuid
        assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 13000
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert memory.total == empty.memory_bytes
        v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, empty.mig_profiles[0].nvml_enum, version=1)
        assert (v1.id, v1.memorySizeMB) == (
            empty.mig_profiles[0].profile_id,
            empty.mig_profiles[0].memory_bytes >> 20,
        )

        gpu_instance = pynvml.nvmlDeviceCreateGpuInstance(handle, 0)  # the first free placement
        ci_v1 = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, 4, 0, version=1)
        compute_instance = pynvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_v1.id)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig) and not pynvml.nvmlDeviceIsMigDeviceHandle(handle)
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert pynvml.nvmlDeviceGetUUID(parent) == empty.uuid
        assert (ci_v1.sliceCount, pynvml.nvmlDeviceGetAttributes(mig).multiprocessorCount) == (7, 98)
        pynvml.nvmlComputeInstanceDestroy(compute_instance)
        pynvml.nvmlGpuInstanceDestroy(gpu_instance)
    finally:
        await backend.close()
