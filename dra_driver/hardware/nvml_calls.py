"""Calling NVML and reading what NVML does not tell from sysfs.

`nvml_call` runs one NVML function and turns its error into a HardwareError with a reason that
callers can act on; `nvml_call_or_none` does the same for questions NVML answers "no" to with an
error code (the code sets below name those answers). Every module names pynvml's functions as
`pynvml.X` at call time, never `from pynvml import X`, so a test that replaces them on the
`pynvml` module reaches every caller.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import pynvml

from dra_driver.hardware.model import HardwareError, HardwareErrorReason

_T = TypeVar("_T")
# pynvml hands out ctypes pointers and structures; they are opaque to this module's types.
NvmlObject: TypeAlias = Any

_REASONS: dict[int, HardwareErrorReason] = {
    pynvml.NVML_ERROR_INVALID_ARGUMENT: HardwareErrorReason.INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NOT_SUPPORTED: HardwareErrorReason.NOT_SUPPORTED,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: HardwareErrorReason.INSUFFICIENT_RESOURCES,
    pynvml.NVML_ERROR_NOT_FOUND: HardwareErrorReason.NOT_FOUND,
    pynvml.NVML_ERROR_GPU_IS_LOST: HardwareErrorReason.GPU_LOST,
    pynvml.NVML_ERROR_NO_PERMISSION: HardwareErrorReason.NO_PERMISSION,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: HardwareErrorReason.LIBRARY_NOT_FOUND,
}
_LIBRARY_HINT = (
    " (libnvidia-ml.so.1 is not installed or not mounted into the container; "
    "on machines without NVIDIA GPUs use --hardware simulated:<profile>)"
)
# How NVML says "this GPU has no such profile" (the constant is unknown to it, or not offered here).
NO_SUCH_PROFILE = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})
NOT_SUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED})
# MIG device indices are sparse: an index without a compute instance behind it answers one of these.
NO_MIG_DEVICE_AT_INDEX = frozenset({pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT})
# GPUs outside an NVLink fabric answer NOT_SUPPORTED; drivers older than the V call lack it entirely.
NO_FABRIC = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def nvml_text(value: str | bytes) -> str:
    """Older nvidia-ml-py releases return bytes where newer ones return str."""
    return value.decode() if isinstance(value, bytes) else value


def _hardware_error(what: str, error: Exception) -> HardwareError:
    code: int = getattr(error, "value", pynvml.NVML_ERROR_UNKNOWN)
    hint = _LIBRARY_HINT if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND else ""
    return HardwareError(f"NVML {what} failed: {error}{hint}", _REASONS.get(code, HardwareErrorReason.OTHER))


def nvml_call(what: str, function: Callable[..., _T], *args: Any) -> _T:
    """Runs one NVML function, turning its error into a HardwareError that says what was asked and
    carries a reason callers can act on without parsing NVML's text."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise _hardware_error(what, error) from error


def nvml_call_or_none(
    what: str, absent: frozenset[int], function: Callable[..., _T], *args: Any
) -> _T | None:
    """nvml_call for questions NVML answers "no" to with an error code: None for the codes in `absent`."""
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        if getattr(error, "value", None) in absent:
            return None
        raise _hardware_error(what, error) from error


def normalize_bus_id(nvml_bus_id: str) -> str:
    """NVML prints an 8-digit PCI domain in upper case; sysfs and Kubernetes use 4 digits, lower case."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def pcie_root_of(bus_id: str, sysfs_devices: Path = SYSFS_PCI_DEVICES) -> str:
    """The root complex ('pci<domain>:<bus>') the device hangs off, read from its sysfs path."""
    link = sysfs_devices / bus_id
    if not link.exists():
        raise HardwareError(f"cannot find GPU {bus_id} under {sysfs_devices}: is /sys mounted?")
    resolved = Path(os.path.realpath(link))
    roots = [part for part in resolved.parts if part.startswith("pci")]
    if not roots:
        raise HardwareError(f"cannot find the PCIe root of GPU {bus_id}: {resolved} has no pci<domain>:<bus>")
    return roots[0]


def iommu_group_of(bus_id: str, sysfs_devices: Path = SYSFS_PCI_DEVICES) -> int | None:
    """The GPU's IOMMU group (sysfs links it to /sys/kernel/iommu_groups/<n>); None with the IOMMU
    off, where the link is missing."""
    link = sysfs_devices / bus_id / "iommu_group"
    try:
        target = link.readlink()
    except FileNotFoundError:
        return None
    if not target.name.isdigit():
        raise HardwareError(f"{link} links to {str(target)!r}, not an IOMMU group")
    return int(target.name)


def numa_node_of(bus_id: str, sysfs_devices: Path = SYSFS_PCI_DEVICES) -> int | None:
    """The NUMA node the kernel ties the GPU to. NVML has no call for it; sysfs writes -1 where the
    platform has no affinity (one socket, many VMs), and kernels built without NUMA omit the file."""
    path = sysfs_devices / bus_id / "numa_node"
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    try:
        node = int(text)
    except ValueError as error:
        raise HardwareError(f"{path} holds {text!r}, not a NUMA node number") from error
    return node if node >= 0 else None
