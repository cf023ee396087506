"""Whole GPUs as DRA devices, and the GPU facts every device of a GPU carries."""

from dra_driver.devices import attributes as names
from dra_driver.devices.model import AttributeValue, Capacity, Device, DeviceType, semantic_version
from dra_driver.devices.naming import gpu_device_name
from dra_driver.hardware.model import Gpu


def shared_gpu_attributes(gpu: Gpu) -> dict[str, AttributeValue]:
    """What a MIG slice or a vGPU share has in common with its GPU: the product, and the topology
    (so `matchAttribute` can keep a multi-device claim on one PCIe root, NUMA node or NVLink
    clique whichever kind of device it asks for)."""
    attributes: dict[str, AttributeValue] = {
        names.PRODUCT_NAME: gpu.product_name,
        names.BRAND: gpu.brand,
        names.ARCHITECTURE: gpu.architecture,
        names.CUDA_COMPUTE_CAPABILITY: semantic_version(gpu.cuda_compute_capability),
        names.DRIVER_VERSION: semantic_version(gpu.driver_version),
        names.CUDA_DRIVER_VERSION: semantic_version(gpu.cuda_driver_version),
        names.STANDARD_PCIE_ROOT: gpu.pcie_root,
    }
    if gpu.numa_node is not None:
        attributes[names.STANDARD_NUMA_NODE] = gpu.numa_node
        attributes[names.LEGACY_NUMA_NODE] = gpu.numa_node
    if gpu.fabric_clique is not None:
        attributes[names.FABRIC_CLIQUE] = gpu.fabric_clique
    return attributes


def parent_attributes(gpu: Gpu) -> dict[str, AttributeValue]:
    """Identifies the GPU a partition lives on."""
    return {names.PARENT_UUID: gpu.uuid, names.PARENT_INDEX: gpu.index, names.PARENT_MINOR: gpu.minor}


def gpu_identity_attributes(gpu: Gpu, device_type: DeviceType) -> dict[str, AttributeValue]:
    return {
        names.TYPE: device_type,
        names.UUID: gpu.uuid,
        names.INDEX: gpu.index,
        names.MINOR: gpu.minor,
        names.STANDARD_PCI_BUS_ID: gpu.pci_bus_id,
        **shared_gpu_attributes(gpu),
    }


def whole_gpu_capacity(gpu: Gpu) -> dict[str, Capacity]:
    """Memory, and the SM count where it is known (0 = NVML and the catalog do not know it)."""
    capacity = {"memory": Capacity(gpu.memory_bytes)}
    if gpu.multiprocessors:
        capacity["multiprocessors"] = Capacity(gpu.multiprocessors)
    return capacity


def whole_gpu_device(gpu: Gpu) -> Device:
    return Device(
        name=gpu_device_name(gpu),
        type="gpu",
        attributes=gpu_identity_attributes(gpu, "gpu"),
        capacity=whole_gpu_capacity(gpu),
    )
