"""The NVML backend where no GPU is present: its errors and its pure helpers.

The full backend runs on real GPUs only (see docs/hardware.md); here NVML's library is really
missing, which is the first thing an operator meets on a misconfigured node.
"""

import asyncio
from pathlib import Path

import pytest

from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.nvml import NvmlBackend, normalize_bus_id, pcie_root_of


def test_a_missing_nvml_library_is_a_clear_hardware_error() -> None:
    backend = NvmlBackend()
    with pytest.raises(HardwareError) as raised:
        asyncio.run(backend.discover())
    message = str(raised.value)
    assert message.startswith("NVML nvmlInit failed: NVML Shared Library Not Found")
    assert "use --hardware simulated:<profile>" in message
    asyncio.run(backend.close())


@pytest.mark.parametrize(
    ("nvml", "sysfs"), [("00000000:18:00.0", "0000:18:00.0"), ("00000001:AB:00.0", "0001:ab:00.0")]
)
def test_bus_ids_use_the_sysfs_form(nvml: str, sysfs: str) -> None:
    assert normalize_bus_id(nvml) == sysfs


def test_the_pcie_root_comes_from_the_device_sysfs_path(tmp_path: Path) -> None:
    device_dir = tmp_path / "devices" / "pci0000:15" / "0000:15:01.0" / "0000:18:00.0"
    device_dir.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:18:00.0").symlink_to(device_dir)

    assert pcie_root_of("0000:18:00.0", bus) == "pci0000:15"


def test_a_device_outside_any_pcie_root_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "0000:18:00.0").mkdir()
    with pytest.raises(HardwareError, match=r"cannot find the PCIe root of GPU 0000:18:00\.0"):
        pcie_root_of("0000:18:00.0", tmp_path)


def test_a_missing_sysfs_entry_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match=r"cannot find GPU 0000:18:00\.0 under .*: is /sys mounted"):
        pcie_root_of("0000:18:00.0", tmp_path)
