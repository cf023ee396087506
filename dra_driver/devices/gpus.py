"""Whole GPUs as DRA devices, and the GPU facts every device of a GPU carries."""

from dra_driver.devices.model import AttributeValue, Capacity, Device, DeviceType, semantic_version
from dra_driver.devices.naming import gpu_device_name
from dra_driver.hardware.model import Gpu

STANDARD_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
STANDARD_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# The standard NUMA attribute (resource.kubernetes.io/numaNode, an int: the NUMA node the kernel
# reports for the device's PCI function; GA as a standard name in Kubernetes 1.37). Other drivers
# (NICs, CPUs, memory) publish the same name, which is what lets one claim `matchAttribute` a GPU
# with their devices; a driver-local name only ever matches this driver's own devices.
STANDARD_NUMA_NODE = "resource.kubernetes.io/numaNode"
# DEPRECATED: the driver-local name published before the standard one; kept for one release so
# existing selectors and constraints keep working, then removed. Same value as STANDARD_NUMA_NODE.
LEGACY_NUMA_NODE = "numaNode"


def shared_gpu_attributes(gpu: Gpu) -> dict[str, AttributeValue]:
    """What a MIG slice or a vGPU share has in common with its GPU: the product, and the topology
    (so `matchAttribute` can keep a multi-device claim on one PCIe root, NUMA node or NVLink
    clique whichever kind of device it asks for)."""
    attributes: dict[str, AttributeValue] = {
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": semantic_version(gpu.cuda_compute_capability),
        "driverVersion": semantic_version(gpu.driver_version),
        "cudaDriverVersion": semantic_version(gpu.cuda_driver_version),
        STANDARD_PCIE_ROOT: gpu.pcie_root,
    }
    if gpu.numa_node is not None:
        attributes[STANDARD_NUMA_NODE] = gpu.numa_node
        attributes[LEGACY_NUMA_NODE] = gpu.numa_node
    if gpu.fabric_clique is not None:
        attributes["fabricClique"] = gpu.fabric_clique
    return attributes


def parent_attributes(gpu: Gpu) -> dict[str, AttributeValue]:
    """Identifies the GPU a partition lives on."""
    return {"parentUUID": gpu.uuid, "parentIndex": gpu.index, "parentMinor": gpu.minor}


def gpu_identity_attributes(gpu: Gpu, device_type: DeviceType) -> dict[str, AttributeValue]:
    return {
        "type": device_type,
        "uuid": gpu.uuid,
        "index": gpu.index,
        "minor": gpu.minor,
        STANDARD_PCI_BUS_ID: gpu.pci_bus_id,
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
