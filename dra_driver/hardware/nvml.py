"""The NVML backend over nvidia-ml-py (import name `pynvml`).

NVML calls block, sometimes for long (a GPU that fell off the bus), so they all run on one
dedicated worker thread: the event loop that answers kubelet never waits on the driver, and
NVML sees calls one at a time. That also makes a MIG change (several NVML calls) atomic with
respect to discovery and to other changes made through this backend.

Reading one GPU is here; calling NVML and reading sysfs are in `nvml_calls`, everything MIG is in
`nvml_mig`.
"""

import asyncio
import ctypes
import functools
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pynvml
import structlog

from dra_driver.hardware import nvml_mig
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import (
    ComputeMode,
    Gpu,
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    Placement,
)
from dra_driver.hardware.nvml_calls import (
    NO_FABRIC,
    SYSFS_PCI_DEVICES,
    NvmlObject,
    iommu_group_of,
    normalize_bus_id,
    numa_node_of,
    nvml_call,
    nvml_call_or_none,
    nvml_text,
    pcie_root_of,
)
from dra_driver.hardware.nvml_library import load_nvml_library

_T = TypeVar("_T")
log = structlog.get_logger("dra_driver.hardware")

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


def _fabric_clique(handle: NvmlObject, where: str) -> str | None:
    """'<cluster UUID>.<clique ID>' once the fabric manager has registered the GPU in an NVLink
    domain (GB200 NVL and the like); None elsewhere and while registration is still under way,
    since a clique that is not final must not be advertised."""
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    answered = nvml_call_or_none(
        f"nvmlDeviceGetGpuFabricInfoV {where}",
        NO_FABRIC,
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
        nvml_text(nvml_call(f"nvmlDeviceGetPciInfo {where}", pynvml.nvmlDeviceGetPciInfo, handle).busId)
    )
    brand = nvml_call(f"nvmlDeviceGetBrand {where}", pynvml.nvmlDeviceGetBrand, handle)
    architecture = nvml_call(f"nvmlDeviceGetArchitecture {where}", pynvml.nvmlDeviceGetArchitecture, handle)
    memory_bytes = nvml_call(f"nvmlDeviceGetMemoryInfo {where}", pynvml.nvmlDeviceGetMemoryInfo, handle).total
    product_name = nvml_text(nvml_call(f"nvmlDeviceGetName {where}", pynvml.nvmlDeviceGetName, handle))
    mig_mode = nvml_mig.mig_mode(handle, where)
    profiles = () if mig_mode is MigMode.UNSUPPORTED else nvml_mig.mig_profiles(handle, memory_bytes, where)
    return Gpu(
        uuid=nvml_text(nvml_call(f"nvmlDeviceGetUUID {where}", pynvml.nvmlDeviceGetUUID, handle)),
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
        iommu_group=iommu_group_of(bus_id, sysfs_devices),
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        mig_mode=mig_mode,
        memory_slices=max(
            (placement.start + placement.size for profile in profiles for placement in profile.placements),
            default=0,
        ),
        mig_profiles=profiles,
        mig_instances=nvml_mig.mig_instances(handle, profiles, where) if mig_mode is MigMode.ENABLED else (),
        fabric_clique=_fabric_clique(handle, where),
    )


def _discover(sysfs_devices: Path) -> tuple[Gpu, ...]:
    driver_version = nvml_text(nvml_call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
    cuda = nvml_call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
    cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
    count = nvml_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
    gpus = []
    for index in range(count):
        try:
            gpus.append(_read_gpu(index, driver_version, cuda_driver_version, sysfs_devices))
        except HardwareError as error:
            # Lost until the node reboots (the health monitor has tainted it): the other GPUs stay
            # offered, as they would after a reboot without it.
            if error.reason is not HardwareErrorReason.GPU_LOST:
                raise
            log.warning("GPU is lost; leaving it out", gpu_index=index, error=str(error))
    return tuple(gpus)


class NvmlBackend:
    def __init__(self, sysfs_devices: Path = SYSFS_PCI_DEVICES, driver_root: Path = Path("/")) -> None:
        """`sysfs_devices` is where the GPUs' PCI entries are read from (PCIe root, NUMA node);
        `driver_root` where libnvidia-ml.so.1 is looked for first (see nvml_library)."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._initialized = False
        self._sysfs_devices = sysfs_devices
        self._driver_root = driver_root
        self._library = ""

    @property
    def description(self) -> str:
        return f"NVML (nvidia-ml-py, {self._library})" if self._library else "NVML (nvidia-ml-py)"

    async def _on_nvml_thread(self, function: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, function)

    async def _initialized_then(self, function: Callable[[], _T]) -> _T:
        """Runs `function` on the NVML thread, after nvmlInit the first time through. The flag is set on
        that thread, so two first calls at once cannot initialize NVML twice."""

        def call() -> _T:
            if not self._initialized:
                self._library = load_nvml_library(self._driver_root)
                nvml_call("nvmlInit", pynvml.nvmlInit)
                self._initialized = True
            return function()

        return await self._on_nvml_thread(call)

    async def discover(self) -> tuple[Gpu, ...]:
        return await self._initialized_then(functools.partial(_discover, self._sysfs_devices))

    async def create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        return await self._initialized_then(
            functools.partial(nvml_mig.create_mig_instance, gpu_uuid, profile_id, placement)
        )

    async def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        await self._initialized_then(
            functools.partial(nvml_mig.destroy_mig_instance, gpu_uuid, gpu_instance_id)
        )

    async def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        return await self._initialized_then(functools.partial(_compute_mode, gpu_uuid))

    async def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        await self._initialized_then(functools.partial(_set_compute_mode, gpu_uuid, mode))

    async def close(self) -> None:
        if self._initialized:
            await self._on_nvml_thread(lambda: nvml_call("nvmlShutdown", pynvml.nvmlShutdown))
            self._initialized = False
        self._thread.shutdown(wait=False)


# nvmlComputeMode_t (nvml.h): NVML_COMPUTEMODE_DEFAULT 0, EXCLUSIVE_THREAD 1 (deprecated),
# PROHIBITED 2, EXCLUSIVE_PROCESS 3.
NVML_COMPUTE_MODES: dict[ComputeMode, int] = {
    "Default": 0,
    "ExclusiveThread": 1,
    "Prohibited": 2,
    "ExclusiveProcess": 3,
}


def _compute_mode(gpu_uuid: str) -> ComputeMode:
    handle = nvml_call(f"nvmlDeviceGetHandleByUUID {gpu_uuid}", pynvml.nvmlDeviceGetHandleByUUID, gpu_uuid)
    value = nvml_call(f"nvmlDeviceGetComputeMode of GPU {gpu_uuid}", pynvml.nvmlDeviceGetComputeMode, handle)
    for mode, number in NVML_COMPUTE_MODES.items():
        if number == value:
            return mode
    raise HardwareError(f"nvmlDeviceGetComputeMode of GPU {gpu_uuid}: unknown compute mode {value}")


def _set_compute_mode(gpu_uuid: str, mode: ComputeMode) -> None:
    handle = nvml_call(f"nvmlDeviceGetHandleByUUID {gpu_uuid}", pynvml.nvmlDeviceGetHandleByUUID, gpu_uuid)
    nvml_call(
        f"nvmlDeviceSetComputeMode {mode} of GPU {gpu_uuid}",
        pynvml.nvmlDeviceSetComputeMode,
        handle,
        NVML_COMPUTE_MODES[mode],
    )
