"""The names of the attributes this driver's devices publish: one vocabulary for the device
model that publishes them (gpus.py, mig.py, vgpu.py) and for what reads them back (DeviceClass
selectors, `dra-driver plan`, `inspect`), so a renamed attribute cannot leave a reader behind.
A mode's own attributes are in its module (`DeviceMode.own_attributes`); a test holds `PUBLISHED`
and those together equal to what the device model publishes on every simulated node.
"""

# Every device: what it is.
TYPE = "type"  # one of devices/model.py DeviceType
UUID = "uuid"
# Whole GPUs (and vGPU-capacity GPUs): where they are.
INDEX = "index"
MINOR = "minor"
# A partition's GPU (MIG devices, vGPU partitions).
PARENT_UUID = "parentUUID"
PARENT_INDEX = "parentIndex"
PARENT_MINOR = "parentMinor"
# The product, shared by every device of a GPU.
PRODUCT_NAME = "productName"
BRAND = "brand"
ARCHITECTURE = "architecture"
CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
DRIVER_VERSION = "driverVersion"
CUDA_DRIVER_VERSION = "cudaDriverVersion"
FABRIC_CLIQUE = "fabricClique"
# MIG devices.
PROFILE = "profile"
PROFILE_ID = "profileId"
PLACEMENT_START = "placementStart"
PLACEMENT_SIZE = "placementSize"
# vGPU-capacity GPUs: not a capacity, since on a shared device a capacity without a request
# policy is consumed whole.
MULTIPROCESSORS = "multiprocessors"
# The attribute a slice's `partitionTypeAttribute` (Kubernetes 1.37 alpha, KEP-5677) names: a
# string that groups the devices drawing from shared counters by what they cost. Upstream's pool
# status controller counts, per value, how many devices there are and how many still fit in the
# counters left, and reports a pool whose devices of one value cost different counters (by
# counter set, counter name and amount) as invalid. So the value names exactly one cost: a vGPU
# partition size on one GPU ("gpu-0-vgpu-10gi"), or the whole GPU next to its partitions
# ("gpu-0"). Dynamic MIG placements do not carry it: two placements of one profile cover
# different memory slices, so no value could group them without breaking that rule.
PARTITION_TYPE = "partitionType"
# Standard names (resource.kubernetes.io), which other drivers publish too.
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

PUBLISHED = frozenset(
    {
        TYPE,
        UUID,
        INDEX,
        MINOR,
        PARENT_UUID,
        PARENT_INDEX,
        PARENT_MINOR,
        PRODUCT_NAME,
        BRAND,
        ARCHITECTURE,
        CUDA_COMPUTE_CAPABILITY,
        DRIVER_VERSION,
        CUDA_DRIVER_VERSION,
        FABRIC_CLIQUE,
        PROFILE,
        PROFILE_ID,
        PLACEMENT_START,
        PLACEMENT_SIZE,
        MULTIPROCESSORS,
        PARTITION_TYPE,
        STANDARD_PCI_BUS_ID,
        STANDARD_PCIE_ROOT,
        STANDARD_NUMA_NODE,
        LEGACY_NUMA_NODE,
    }
)
