"""The hardware facts the rest of the driver works from.

Frozen and free of Kubernetes so that device planning stays a pure function of these values,
whichever backend (NVML or simulated) produced them.
"""

from dataclasses import dataclass


class HardwareError(Exception):
    """The hardware (or its simulation) could not be read or did not answer as expected."""


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    index: int
    minor: int
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str
    pcie_root: str
    driver_version: str
    cuda_driver_version: str
