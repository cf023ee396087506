"""The NVML backend over nvidia-ml-py (import name `pynvml`).

NVML calls block, sometimes for long (a GPU that fell off the bus), so they all run on one
dedicated worker thread: the event loop that answers kubelet never waits on the driver, and
NVML sees calls one at a time.
"""

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from dra_driver.hardware.model import Gpu, HardwareError

_T = TypeVar("_T")

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
_SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def _text(value: str | bytes) -> str:
    """Older nvidia-ml-py releases return bytes where newer ones return str."""
    return value.decode() if isinstance(value, bytes) else value


def nvml_call(what: str, function: Callable[..., _T], *args: Any) -> _T:
    """Runs one NVML function, turning its error into a HardwareError that says what was asked."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        hint = ""
        if getattr(error, "value", None) == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            hint = (
                " (libnvidia-ml.so.1 is not installed or not mounted into the container; "
                "on machines without NVIDIA GPUs use --hardware simulated:<profile>)"
            )
        raise HardwareError(f"NVML {what} failed: {error}{hint}") from error


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


def _read_gpu(index: int, driver_version: str, cuda_driver_version: str) -> Gpu:
    handle = nvml_call(f"nvmlDeviceGetHandleByIndex({index})", pynvml.nvmlDeviceGetHandleByIndex, index)
    where = f"for GPU {index}"
    major, minor_cc = nvml_call(
        f"nvmlDeviceGetCudaComputeCapability {where}", pynvml.nvmlDeviceGetCudaComputeCapability, handle
    )
    attributes = nvml_call(f"nvmlDeviceGetAttributes {where}", pynvml.nvmlDeviceGetAttributes, handle)
    bus_id = normalize_bus_id(
        _text(nvml_call(f"nvmlDeviceGetPciInfo {where}", pynvml.nvmlDeviceGetPciInfo, handle).busId)
    )
    brand = nvml_call(f"nvmlDeviceGetBrand {where}", pynvml.nvmlDeviceGetBrand, handle)
    architecture = nvml_call(f"nvmlDeviceGetArchitecture {where}", pynvml.nvmlDeviceGetArchitecture, handle)
    return Gpu(
        uuid=_text(nvml_call(f"nvmlDeviceGetUUID {where}", pynvml.nvmlDeviceGetUUID, handle)),
        index=index,
        minor=nvml_call(f"nvmlDeviceGetMinorNumber {where}", pynvml.nvmlDeviceGetMinorNumber, handle),
        product_name=_text(nvml_call(f"nvmlDeviceGetName {where}", pynvml.nvmlDeviceGetName, handle)),
        brand=_BRANDS.get(brand, f"Brand{brand}"),
        architecture=_ARCHITECTURES.get(architecture, f"Architecture{architecture}"),
        cuda_compute_capability=f"{major}.{minor_cc}",
        memory_bytes=nvml_call(
            f"nvmlDeviceGetMemoryInfo {where}", pynvml.nvmlDeviceGetMemoryInfo, handle
        ).total,
        multiprocessors=attributes.multiprocessorCount,
        pci_bus_id=bus_id,
        pcie_root=pcie_root_of(bus_id),
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
    )


def _discover() -> tuple[Gpu, ...]:
    driver_version = _text(nvml_call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
    cuda = nvml_call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
    cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
    count = nvml_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
    return tuple(_read_gpu(index, driver_version, cuda_driver_version) for index in range(count))


class NvmlBackend:
    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._initialized = False

    @property
    def description(self) -> str:
        return "NVML (nvidia-ml-py)"

    async def _on_nvml_thread(self, function: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, function)

    async def discover(self) -> tuple[Gpu, ...]:
        if not self._initialized:
            await self._on_nvml_thread(lambda: nvml_call("nvmlInit", pynvml.nvmlInit))
            self._initialized = True
        return await self._on_nvml_thread(_discover)

    async def close(self) -> None:
        if self._initialized:
            await self._on_nvml_thread(lambda: nvml_call("nvmlShutdown", pynvml.nvmlShutdown))
            self._initialized = False
        self._thread.shutdown(wait=False)
