"""MIG capability device nodes: what lets a container use a MIG device, and admin access to MIG.

The driver scopes a process to a MIG device by the capability nodes it can open: the GPU
instance's and the compute instance's `access` capability (plus the GPU's own node). The driver
announces each capability in a proc file that names the minor number of its node
/dev/nvidia-caps/nvidia-cap<minor>:

    DeviceFileMinor: 34
    DeviceFileMode: 292

The minors are handed out as instances are created, so they are read when a claim is prepared,
never guessed. `config` and `monitor` are the node-wide capabilities to create MIG instances and
to watch all of them.
"""

from pathlib import Path

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.claims.edits.cdi import ContainerEdits, DeviceNode

CAPABILITIES_DIR = "driver/nvidia/capabilities"  # below the proc root
CAP_DEVICE_DIR = "/dev/nvidia-caps"
_MINOR_KEY = "DeviceFileMinor"
_MODE_KEY = "DeviceFileMode"
_MAX_MINOR = (1 << 20) - 1  # Linux minor numbers have 20 bits
_MAX_MODE = 0o7777


class CapabilityFileError(OperatorFault, ValueError):
    """A capability file that is missing or says something other than what the driver writes."""


class Capability(msgspec.Struct, frozen=True):
    source: Path  # the proc file it was read from
    minor: int
    mode: int  # of the device node, as the driver makes it (292 is 0o444)

    @property
    def device_path(self) -> str:
        return f"{CAP_DEVICE_DIR}/nvidia-cap{self.minor}"


def _number(source: Path, key: str, value: str, maximum: int) -> int:
    if not value.isascii() or not value.isdecimal() or int(value) > maximum:
        raise CapabilityFileError(
            f"{source}: expected '{key}: <decimal number up to {maximum}>', found {key}: {value!r}"
        )
    return int(value)


def parse_capability(text: str, source: Path) -> Capability:
    """Reads the `DeviceFileMinor` and `DeviceFileMode` lines; other lines are left alone, so
    a driver that adds some does not break us. `source` names the file in errors."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, separator, value = line.partition(":")
        if not separator or key.strip() not in (_MINOR_KEY, _MODE_KEY):
            continue
        if key.strip() in values:
            raise CapabilityFileError(f"{source}: {key.strip()} appears more than once")
        values[key.strip()] = value.strip()
    for key in (_MINOR_KEY, _MODE_KEY):
        if key not in values:
            raise CapabilityFileError(f"{source}: expected a line '{key}: <decimal number>', found none")
    return Capability(
        source=source,
        minor=_number(source, _MINOR_KEY, values[_MINOR_KEY], _MAX_MINOR),
        mode=_number(source, _MODE_KEY, values[_MODE_KEY], _MAX_MODE),
    )


def read_capability(path: Path) -> Capability:
    try:
        text = path.read_text()
    except OSError as error:
        raise CapabilityFileError(
            f"cannot read capability file {path}: {error.strerror or error}; "
            "it exists while the driver is loaded and the capability (MIG instance) exists"
        ) from error
    return parse_capability(text, path)


def mig_instance_capabilities(
    proc_root: Path, gpu_minor: int, gpu_instance: int, compute_instance: int
) -> tuple[Capability, Capability]:
    """The access capabilities of one MIG device: its GPU instance's, then its compute
    instance's, for the GPU whose device node is /dev/nvidia<gpu_minor>."""
    gi_dir = proc_root / CAPABILITIES_DIR / f"gpu{gpu_minor}" / "mig" / f"gi{gpu_instance}"
    return (
        read_capability(gi_dir / "access"),
        read_capability(gi_dir / f"ci{compute_instance}" / "access"),
    )


def mig_admin_capabilities(proc_root: Path) -> tuple[Capability, Capability]:
    """The node-wide `config` (create and destroy MIG instances) and `monitor` (see all of them)
    capabilities."""
    mig_dir = proc_root / CAPABILITIES_DIR / "mig"
    return read_capability(mig_dir / "config"), read_capability(mig_dir / "monitor")


def capability_edits(capabilities: tuple[Capability, ...], dev_root: Path) -> ContainerEdits:
    """The capabilities' device nodes, as they exist below `dev_root` (see DeviceNode.under)."""
    return ContainerEdits(
        device_nodes=tuple(DeviceNode.under(dev_root, capability.device_path) for capability in capabilities)
    )
