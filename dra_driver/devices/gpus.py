"""Whole GPUs as DRA devices."""

from collections.abc import Mapping
from dataclasses import dataclass

from dra_driver.devices.model import AttributeValue, Device, bytes_quantity, semantic_version
from dra_driver.hardware.model import Gpu

STANDARD_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
STANDARD_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def gpu_device_name(gpu: Gpu) -> str:
    """Named by NVML minor number, which (unlike the index) is stable across reboots."""
    return f"gpu-{gpu.minor}"


def whole_gpu_device(gpu: Gpu) -> Device:
    attributes: dict[str, AttributeValue] = {
        "type": "gpu",
        "uuid": gpu.uuid,
        "index": gpu.index,
        "minor": gpu.minor,
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": semantic_version(gpu.cuda_compute_capability),
        "driverVersion": semantic_version(gpu.driver_version),
        "cudaDriverVersion": semantic_version(gpu.cuda_driver_version),
        STANDARD_PCI_BUS_ID: gpu.pci_bus_id,
        STANDARD_PCIE_ROOT: gpu.pcie_root,
    }
    capacity = {
        "memory": bytes_quantity(gpu.memory_bytes),
        "multiprocessors": str(gpu.multiprocessors),
    }
    return Device(name=gpu_device_name(gpu), attributes=attributes, capacity=capacity)


@dataclass(frozen=True, slots=True)
class Inventory:
    """What this node offers: devices sorted by name, and the GPU behind each one."""

    devices: tuple[Device, ...]
    gpu_of_device: Mapping[str, Gpu]


def whole_gpu_inventory(gpus: tuple[Gpu, ...]) -> Inventory:
    devices = sorted((whole_gpu_device(gpu) for gpu in gpus), key=lambda device: device.name)
    return Inventory(
        devices=tuple(devices),
        gpu_of_device={gpu_device_name(gpu): gpu for gpu in gpus},
    )
