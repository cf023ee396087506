"""MIG capability files under a proc root made of real files, as the driver writes them."""

import re
from pathlib import Path

import pytest

from dra_driver.claims.edits.cdi import DeviceNode
from dra_driver.claims.edits.mig_caps import (
    Capability,
    CapabilityFileError,
    capability_edits,
    mig_admin_capabilities,
    mig_instance_capabilities,
    parse_capability,
    read_capability,
)

SOURCE = Path("/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access")


def write_cap(proc_root: Path, relative: str, minor: int, mode: int = 292) -> Path:
    path = proc_root / "driver/nvidia/capabilities" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\n")
    return path


def test_instance_capabilities_come_from_the_gpu_and_compute_instance_files(tmp_path: Path) -> None:
    gi = write_cap(tmp_path, "gpu3/mig/gi2/access", 21)
    ci = write_cap(tmp_path, "gpu3/mig/gi2/ci1/access", 22)
    write_cap(tmp_path, "gpu3/mig/gi2/ci0/access", 99)  # another compute instance of the same GI
    write_cap(tmp_path, "gpu0/mig/gi2/access", 98)  # the same GI id on another GPU

    caps = mig_instance_capabilities(tmp_path, gpu_minor=3, gpu_instance=2, compute_instance=1)

    assert caps == (Capability(gi, 21, 292), Capability(ci, 22, 292))
    assert capability_edits(caps, Path("/")).to_json() == {
        "deviceNodes": [{"path": "/dev/nvidia-caps/nvidia-cap21"}, {"path": "/dev/nvidia-caps/nvidia-cap22"}]
    }


def test_admin_capabilities_are_config_and_monitor(tmp_path: Path) -> None:
    config = write_cap(tmp_path, "mig/config", 1, mode=256)
    monitor = write_cap(tmp_path, "mig/monitor", 2)

    caps = mig_admin_capabilities(tmp_path)

    assert caps == (Capability(config, 1, 0o400), Capability(monitor, 2, 0o444))
    assert capability_edits(caps, tmp_path / "driver-root").device_nodes == (
        DeviceNode("/dev/nvidia-caps/nvidia-cap1", f"{tmp_path}/driver-root/dev/nvidia-caps/nvidia-cap1"),
        DeviceNode("/dev/nvidia-caps/nvidia-cap2", f"{tmp_path}/driver-root/dev/nvidia-caps/nvidia-cap2"),
    )


def test_the_parser_ignores_lines_it_does_not_need() -> None:
    text = "# written by the driver\nDeviceFileMode:   292\nSomethingNew: x\nDeviceFileMinor:7"
    assert parse_capability(text, SOURCE) == Capability(SOURCE, 7, 0o444)
    assert Capability(SOURCE, 7, 0o444).device_path == "/dev/nvidia-caps/nvidia-cap7"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("DeviceFileMode: 292\n", "expected a line 'DeviceFileMinor: <decimal number>', found none"),
        ("DeviceFileMinor: 3\n", "expected a line 'DeviceFileMode: <decimal number>', found none"),
        ("", "expected a line 'DeviceFileMinor"),
        ("DeviceFileMinor: -3\nDeviceFileMode: 292\n", "found DeviceFileMinor: '-3'"),
        ("DeviceFileMinor: 0x1f\nDeviceFileMode: 292\n", "found DeviceFileMinor: '0x1f'"),
        ("DeviceFileMinor: \nDeviceFileMode: 292\n", "found DeviceFileMinor: ''"),
        ("DeviceFileMinor: 1048576\nDeviceFileMode: 292\n", "up to 1048575"),
        ("DeviceFileMinor: 3\nDeviceFileMode: 4096\n", "found DeviceFileMode: '4096'"),
        (
            "DeviceFileMinor: 3\nDeviceFileMinor: 4\nDeviceFileMode: 292\n",
            "DeviceFileMinor appears more than once",
        ),
        ("DeviceFileMinor: \uff13\nDeviceFileMode: 292\n", "found DeviceFileMinor: '\uff13'"),
    ],
)
def test_malformed_files_are_refused_naming_the_file(text: str, message: str) -> None:
    with pytest.raises(CapabilityFileError) as raised:
        parse_capability(text, SOURCE)
    assert str(raised.value).startswith(f"{SOURCE}: ")
    assert message in str(raised.value)


def test_a_malformed_file_on_disk_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "driver/nvidia/capabilities/mig/config"
    path.parent.mkdir(parents=True)
    path.write_text("DeviceFileMinor: one\nDeviceFileMode: 292\n")

    with pytest.raises(
        CapabilityFileError, match=f"^{re.escape(str(path))}: expected 'DeviceFileMinor: <decimal"
    ):
        mig_admin_capabilities(tmp_path)


def test_a_missing_instance_is_an_error_naming_the_file(tmp_path: Path) -> None:
    write_cap(tmp_path, "gpu0/mig/gi1/access", 10)
    missing = tmp_path / "driver/nvidia/capabilities/gpu0/mig/gi1/ci4/access"

    with pytest.raises(CapabilityFileError) as raised:
        mig_instance_capabilities(tmp_path, gpu_minor=0, gpu_instance=1, compute_instance=4)

    assert str(raised.value).startswith(f"cannot read capability file {missing}: No such file or directory")


def test_a_directory_where_a_file_belongs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "access").mkdir()
    with pytest.raises(CapabilityFileError, match=r"cannot read capability file .*/access: Is a directory"):
        read_capability(tmp_path / "access")
