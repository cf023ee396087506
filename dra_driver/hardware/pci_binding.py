"""A GPU's kernel driver on the PCI bus, and binding it to vfio-pci for a VM and back (mode vfio).

Through sysfs, as the kernel documents it: `driver_override` names the driver the device may
bind to, `driver/unbind` lets it go, `drivers_probe` binds it to the override, and
`drivers/<name>/bind` to a named driver. Each step is checked by reading the `driver` link back,
so a kernel that refused (no vfio-pci module loaded, the GPU still open) is told as an error, not
taken for done. Both directions are safe to repeat, as the record protocol needs.
"""

import re
from pathlib import Path

from dra_driver.hardware.model import HardwareError

VFIO_DRIVER = "vfio-pci"
_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


class PciBinding:
    """The PCI devices under `sysfs_root` (/sys on a node)."""

    def __init__(self, sysfs_root: Path) -> None:
        self._bus = sysfs_root / "bus" / "pci"

    def driver(self, address: str) -> str | None:
        """The driver the device is bound to now (None: none)."""
        link = self._device(address) / "driver"
        try:
            return link.readlink().name
        except FileNotFoundError:
            return None
        except OSError as error:
            raise HardwareError(f"cannot read {link}: {error}") from error

    def bind_vfio(self, address: str) -> None:
        if self.driver(address) == VFIO_DRIVER:
            return
        device = self._device(address)
        self._write(device / "driver_override", VFIO_DRIVER)
        if self.driver(address) is not None:
            self._write(device / "driver" / "unbind", address)
        self._write(self._bus / "drivers_probe", address)
        if (now := self.driver(address)) != VFIO_DRIVER:
            raise HardwareError(
                f"PCI device {address} is bound to {now or 'no driver'} after binding it to {VFIO_DRIVER}; "
                f"is the {VFIO_DRIVER} module loaded (modprobe {VFIO_DRIVER})?"
            )

    def give_back(self, address: str, driver: str) -> None:
        """Back to `driver` (what it had before the claim), the override cleared."""
        device = self._device(address)
        now = self.driver(address)
        if now == driver:
            return
        self._write(device / "driver_override", "\n")
        if now is not None:
            self._write(device / "driver" / "unbind", address)
        self._write(self._bus / "drivers" / driver / "bind", address)
        if (after := self.driver(address)) != driver:
            raise HardwareError(
                f"PCI device {address} is bound to {after or 'no driver'}, not back to {driver}"
            )

    def _device(self, address: str) -> Path:
        if not _ADDRESS.fullmatch(address):
            raise HardwareError(f"{address!r} is not a PCI address such as 0000:c5:00.0")
        return self._bus / "devices" / address

    def _write(self, path: Path, text: str) -> None:
        """One write of a sysfs attribute (the kernel acts on the write itself)."""
        try:
            with path.open("w", encoding="ascii") as attribute:
                attribute.write(text)
        except OSError as error:
            raise HardwareError(f"cannot write {text.strip()!r} to {path}: {error}") from error
