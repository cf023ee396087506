"""Driver discovery on real directory trees: real files and real symlinks, as an installer leaves them."""

from pathlib import Path

import pytest

from dra_driver.claims.edits.cdi import DeviceNode, Mount
from dra_driver.claims.edits.driver_edits import common_edits, container_library_dirs, control_device_nodes
from dra_driver.hardware.driver_root import (
    BINARIES,
    READ_ONLY_BIND,
    DeviceRoot,
    DriverFile,
    UnusablePath,
    UnusablePathError,
    device_root,
    discover_driver,
    resolve_in_root,
)
from tests.support.driver_trees import SONAMES, VERSION

OLD_VERSION = "570.124.06"


def put(root: Path, path: str, content: str = "") -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content or path)
    return target


def link(root: Path, path: str, points_to: str) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(points_to)
    return target


def install_driver(
    root: Path, library_dir: str, version: str = VERSION, binary_dir: str = "/usr/bin"
) -> None:
    """What the installer leaves: versioned libraries with their SONAME symlinks, tools, firmware."""
    for name, soname in SONAMES.items():
        put(root, f"{library_dir}/lib{name}.so.{version}")
        if soname:
            link(root, f"{library_dir}/lib{name}.so.{soname}", f"lib{name}.so.{version}")
    for binary in BINARIES:
        put(root, f"{binary_dir}/{binary}")
    put(root, f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin")
    put(root, f"/lib/firmware/nvidia/{version}/gsp_tu10x.bin")


def expected_libraries(library_dir: str, version: str = VERSION) -> tuple[DriverFile, ...]:
    return tuple(
        DriverFile(
            path=f"{library_dir}/lib{name}.so.{version}",
            resolved=f"{library_dir}/lib{name}.so.{version}",
            soname=f"lib{name}.so.{soname}" if soname else "",
        )
        for name, soname in SONAMES.items()
    )


def test_a_plain_x86_64_install_is_found_whole(tmp_path: Path) -> None:
    install_driver(tmp_path, "/usr/lib64")

    found = discover_driver(tmp_path, VERSION)

    assert found.version == VERSION
    assert found.libraries == expected_libraries("/usr/lib64")
    assert found.binaries == tuple(DriverFile(f"/usr/bin/{name}", f"/usr/bin/{name}") for name in BINARIES)
    assert [file.path for file in found.firmware] == [
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    ]
    assert found.missing == ()
    assert found.unusable == ()


@pytest.mark.parametrize("container_dir", ["/usr/lib64", "/usr/lib/x86_64-linux-gnu"])
def test_each_library_is_mounted_read_only_where_both_loader_families_look_and_at_its_soname(
    tmp_path: Path, container_dir: str
) -> None:
    install_driver(tmp_path, "/usr/lib64")

    edits = common_edits(discover_driver(tmp_path, VERSION), (), tmp_path, "x86_64")
    mounts = {mount.container_path: mount for mount in edits.mounts}

    versioned = f"{tmp_path}/usr/lib64/libcuda.so.{VERSION}"
    assert mounts[f"{container_dir}/libcuda.so.{VERSION}"] == Mount(
        versioned, f"{container_dir}/libcuda.so.{VERSION}", ("ro", "nosuid", "nodev", "bind")
    )
    # The SONAME mount shows the versioned file, not the installer's symlink.
    soname = f"{container_dir}/libcuda.so.1"
    assert mounts[soname] == Mount(versioned, soname, READ_ONLY_BIND)
    assert mounts[f"{container_dir}/libnvidia-nvvm.so.4"].host_path.endswith(f"libnvidia-nvvm.so.{VERSION}")
    assert mounts["/usr/bin/nvidia-smi"].host_path == f"{tmp_path}/usr/bin/nvidia-smi"
    assert all(mount.options == READ_ONLY_BIND for mount in edits.mounts)
    assert not [path for path in mounts if "gpucomp" in path and not path.endswith(VERSION)]
    # versioned + SONAME per library (two have no separate SONAME) in two directories, the
    # tools, two firmware files
    assert len(edits.mounts) == 2 * (2 * len(SONAMES) - 2) + len(BINARIES) + 2
    assert len(mounts) == len(edits.mounts)
    assert edits.device_nodes == ()


def test_aarch64_merged_usr_layout(tmp_path: Path) -> None:
    install_driver(tmp_path, "/usr/lib/aarch64-linux-gnu", binary_dir="/usr/bin")
    (tmp_path / "lib" / "firmware").rename(tmp_path / "usr" / "lib" / "firmware")
    (tmp_path / "lib").rmdir()
    link(tmp_path, "/lib", "usr/lib")  # merged /usr: /lib and /bin are symlinks into /usr
    link(tmp_path, "/bin", "usr/bin")

    found = discover_driver(tmp_path, VERSION)

    assert found.libraries == expected_libraries("/usr/lib/aarch64-linux-gnu")
    assert found.firmware[0] == DriverFile(
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    )
    assert [file.path for file in found.binaries] == [f"/usr/bin/{name}" for name in BINARIES]
    assert found.missing == ()
    mounts = {m.container_path: m.host_path for m in common_edits(found, (), found.root, "aarch64").mounts}
    assert mounts["/usr/lib/aarch64-linux-gnu/libcuda.so.1"] == mounts["/usr/lib64/libcuda.so.1"]
    assert mounts["/usr/lib64/libcuda.so.1"] == f"{tmp_path}/usr/lib/aarch64-linux-gnu/libcuda.so.{VERSION}"
    assert not [path for path in mounts if "x86_64" in path]
    assert mounts[f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"] == (
        f"{tmp_path}/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    )


def test_absolute_symlinks_mean_paths_inside_the_driver_root(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    install_driver(root, "/opt/nvidia/lib")
    link(root, "/usr/lib64", "/opt/nvidia/lib")

    found = discover_driver(root, VERSION)

    cuda = next(file for file in found.libraries if "libcuda." in file.path)
    assert cuda == DriverFile(
        f"/usr/lib64/libcuda.so.{VERSION}", f"/opt/nvidia/lib/libcuda.so.{VERSION}", "libcuda.so.1"
    )
    assert (
        Mount(f"{root}/opt/nvidia/lib/libcuda.so.{VERSION}", "/usr/lib64/libcuda.so.1", READ_ONLY_BIND)
        in common_edits(found, (), found.root, "x86_64").mounts
    )


def test_dangling_and_escaping_symlinks_are_refused_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    install_driver(root, "/usr/lib64")
    outside = put(tmp_path, f"/outside/libnvidia-opencl.so.{VERSION}", "not the driver's")
    for name in ("nvidia-cfg", "nvidia-opencl", "nvidia-allocator"):
        (root / f"usr/lib64/lib{name}.so.{VERSION}").unlink()
    link(root, f"/usr/lib64/libnvidia-cfg.so.{VERSION}", f"libnvidia-cfg.so.{VERSION}.real")
    link(root, f"/usr/lib64/libnvidia-opencl.so.{VERSION}", f"../../../outside/libnvidia-opencl.so.{VERSION}")
    # An absolute target names a path inside the root, never the host file of that name.
    link(root, f"/usr/lib64/libnvidia-allocator.so.{VERSION}", str(outside))

    found = discover_driver(root, VERSION)

    assert found.unusable == (
        UnusablePath(
            f"/usr/lib64/libnvidia-allocator.so.{VERSION}",
            "symlink target does not exist inside the driver root",
        ),
        UnusablePath(
            f"/usr/lib64/libnvidia-cfg.so.{VERSION}", "symlink target does not exist inside the driver root"
        ),
        UnusablePath(f"/usr/lib64/libnvidia-opencl.so.{VERSION}", "symlink climbs out of the driver root"),
    )
    assert found.missing == tuple(
        f"lib{name}.so.{VERSION}" for name in ("nvidia-allocator", "nvidia-cfg", "nvidia-opencl")
    )
    mounts = common_edits(found, (), found.root, "x86_64").mounts
    assert all(mount.host_path.startswith(f"{root}/") for mount in mounts)
    assert not [
        mount for mount in mounts if "opencl" in mount.container_path or "cfg" in mount.container_path
    ]


def test_a_broken_directory_symlink_is_reported_once(tmp_path: Path) -> None:
    install_driver(tmp_path, "/usr/lib/x86_64-linux-gnu")
    link(tmp_path, "/usr/lib64", "/nowhere")

    found = discover_driver(tmp_path, VERSION)

    assert found.unusable == (
        UnusablePath("/usr/lib64", "symlink target does not exist inside the driver root"),
    )
    assert found.libraries == expected_libraries("/usr/lib/x86_64-linux-gnu")


def test_files_of_another_driver_version_are_ignored(tmp_path: Path) -> None:
    install_driver(tmp_path, "/usr/lib64", version=OLD_VERSION)
    put(tmp_path, f"/usr/lib64/libcuda.so.{VERSION}")

    found = discover_driver(tmp_path, VERSION)

    assert [file.path for file in found.libraries] == [f"/usr/lib64/libcuda.so.{VERSION}"]
    assert f"libnvidia-ml.so.{VERSION}" in found.missing
    assert f"/lib/firmware/nvidia/{VERSION}/gsp*.bin" in found.missing
    assert len(found.binaries) == len(BINARIES)  # tools carry no version in their names
    assert not [m for m in common_edits(found, (), found.root, "x86_64").mounts if OLD_VERSION in m.host_path]


def test_unknown_version_takes_the_newest_driver_found(tmp_path: Path) -> None:
    install_driver(tmp_path, "/usr/lib/x86_64-linux-gnu", version=OLD_VERSION)
    install_driver(tmp_path, "/usr/lib64", version=VERSION)

    found = discover_driver(tmp_path, "unknown")

    assert found.version == VERSION
    assert found.libraries == expected_libraries("/usr/lib64")
    assert found.missing == ()


def test_unknown_version_without_any_library_reports_everything_versioned_missing(tmp_path: Path) -> None:
    put(tmp_path, "/usr/bin/nvidia-smi")

    found = discover_driver(tmp_path, "unknown")

    assert found.version == "unknown"
    assert found.libraries == found.firmware == ()
    assert [file.path for file in found.binaries] == ["/usr/bin/nvidia-smi"]
    assert "libcuda.so.*" in found.missing
    assert "libnvidia-pkcs11-openssl3.so.*" not in found.missing  # only some builds ship it
    assert "nvidia-persistenced" in found.missing


def test_resolution_follows_relative_links_and_refuses_loops(tmp_path: Path) -> None:
    put(tmp_path, "/usr/lib/real/file")
    link(tmp_path, "/usr/lib/alias", "./real/../real")
    link(tmp_path, "/loop-a", "loop-b")
    link(tmp_path, "/loop-b", "loop-a")

    assert str(resolve_in_root(tmp_path, "/usr/lib/alias/file")) == "/usr/lib/real/file"
    assert resolve_in_root(tmp_path, "/usr/lib/none") is None
    with pytest.raises(UnusablePathError, match="too many levels of symlinks"):
        resolve_in_root(tmp_path, "/loop-a")


def test_control_device_nodes_below_a_dev_root(tmp_path: Path) -> None:
    """Checked for in the agent's view, named in the host's."""
    seen = tmp_path / "driver-root"
    dev_root = DeviceRoot(seen, Path("/run/nvidia/driver"))
    assert control_device_nodes(dev_root) == (
        DeviceNode("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
        DeviceNode("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm"),
        DeviceNode("/dev/nvidia-uvm-tools", "/run/nvidia/driver/dev/nvidia-uvm-tools"),
    )
    put(seen, "/dev/nvidia-modeset")
    assert control_device_nodes(dev_root)[-1] == DeviceNode(
        "/dev/nvidia-modeset", "/run/nvidia/driver/dev/nvidia-modeset"
    )


def test_on_a_plain_host_device_nodes_need_no_host_path() -> None:
    nodes = control_device_nodes(DeviceRoot(Path("/"), Path("/")))
    assert [node.path for node in nodes][:3] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert all(node.host_path == "" for node in nodes)
    assert ("/dev/nvidia-modeset" in [node.path for node in nodes]) == Path("/dev/nvidia-modeset").exists()


def test_the_device_root_is_the_driver_root_only_where_it_has_a_dev_directory(tmp_path: Path) -> None:
    seen = tmp_path / "driver-root"
    seen.mkdir()
    assert device_root(seen, Path("/run/nvidia/driver")) == DeviceRoot(Path("/"), Path("/"))
    (seen / "dev").mkdir()
    assert device_root(seen, Path("/run/nvidia/driver")) == DeviceRoot(seen, Path("/run/nvidia/driver"))


@pytest.mark.parametrize("host_root", ["/", "/run/nvidia/driver"])
def test_mounts_name_the_files_below_the_host_root_not_the_agents_view(
    tmp_path: Path, host_root: str
) -> None:
    """The agent reads the driver root where its pod mounts it; the runtime that reads the spec
    resolves host paths on the host, where only `host_root` means the driver root."""
    seen = tmp_path / "driver-root"
    install_driver(seen, "/usr/lib/x86_64-linux-gnu")
    (seen / "dev").mkdir()
    found = discover_driver(seen, VERSION)
    nodes = control_device_nodes(device_root(seen, Path(host_root)))
    edits = common_edits(found, nodes, Path(host_root), "x86_64")

    prefix = host_root.rstrip("/")
    host_paths = [mount.host_path for mount in edits.mounts]
    assert f"{prefix}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}" in host_paths
    assert f"{prefix}/usr/bin/nvidia-smi" in host_paths
    assert all(path.startswith(f"{prefix}/") for path in host_paths)
    assert not [path for path in host_paths if str(seen) in path]
    node_paths = [node.host_path or node.path for node in edits.nodes()]
    assert node_paths[:3] == [
        f"{prefix}/dev/nvidiactl",
        f"{prefix}/dev/nvidia-uvm",
        f"{prefix}/dev/nvidia-uvm-tools",
    ]


def test_container_library_dirs_are_both_loader_families_for_the_nodes_architecture() -> None:
    assert container_library_dirs("x86_64") == ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")
    assert container_library_dirs("aarch64") == ("/usr/lib/aarch64-linux-gnu", "/usr/lib64")
    # Another architecture's multiarch name is not known: Debian's loader searches /usr/lib too.
    assert container_library_dirs("riscv64") == ("/usr/lib", "/usr/lib64")
