"""A sysfs PCI tree whose writes act as the kernel's do, for mode vfio without hardware.

The tree has what `PciBinding` reads and writes (each GPU's `driver` and `iommu_group` links, its
`driver_override`, the drivers' `bind` and `unbind`, `drivers_probe`); a write is made to the file
and then acted on here, so that the links read back as after the kernel's own handling. It has
never been compared with a real kernel's: mode vfio has not run on real hardware.
"""

import os
from collections.abc import Sequence
from pathlib import Path

from dra_driver.hardware.model import Gpu
from dra_driver.hardware.pci_binding import VFIO_DRIVER, PciBinding

GPU_DRIVER = "nvidia"


def make_pci_tree(
    sysfs_root: Path, gpus: Sequence[Gpu], drivers: Sequence[str] = (GPU_DRIVER, VFIO_DRIVER)
) -> None:
    """Each GPU bound to nvidia, in the IOMMU group the model gives it."""
    bus = sysfs_root / "bus" / "pci"
    for driver in drivers:
        (bus / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        for name in ("bind", "unbind"):
            (bus / "drivers" / driver / name).touch()
    (bus / "drivers_probe").touch()
    for gpu in gpus:
        device = bus / "devices" / gpu.pci_bus_id
        if device.exists():
            continue  # made by an earlier start: its binding is the node's state
        device.mkdir(parents=True)
        (device / "driver_override").write_text("(null)\n", encoding="ascii")
        _link(device / "driver", bus / "drivers" / GPU_DRIVER)
        if gpu.iommu_group is not None:
            group = sysfs_root / "kernel" / "iommu_groups" / str(gpu.iommu_group)
            group.mkdir(parents=True, exist_ok=True)
            _link(device / "iommu_group", group)


class SimulatedPciBinding(PciBinding):
    def __init__(self, sysfs_root: Path) -> None:
        super().__init__(sysfs_root)
        self._root = sysfs_root

    def _write(self, path: Path, text: str) -> None:
        super()._write(path, text)
        bus = self._root / "bus" / "pci"
        address = text.strip()
        if path.name == "unbind":
            (bus / "devices" / address / "driver").unlink(missing_ok=True)
        elif path.name == "drivers_probe":
            override = (bus / "devices" / address / "driver_override").read_text(encoding="ascii").strip()
            driver = override if override not in ("", "(null)") else GPU_DRIVER
            if (bus / "drivers" / driver).is_dir() and not (bus / "devices" / address / "driver").exists():
                _link(bus / "devices" / address / "driver", bus / "drivers" / driver)
        elif path.name == "bind":
            _link(bus / "devices" / address / "driver", path.parent)


def _link(link: Path, target: Path) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))
