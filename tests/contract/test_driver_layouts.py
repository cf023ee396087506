"""The driver where real nodes keep it, found the way the root's own loader finds it, and mounted
where a container's loader looks: gcc-built libraries and the real ldconfig's cache."""

from pathlib import Path

import pytest

from dra_driver.claims.edits.driver_edits import common_edits
from dra_driver.hardware.driver_root import UnusablePath, discover_driver
from tests.support.driver_trees import SONAMES, VERSION, Layout, build_libraries, install

DEBIAN_X86_64 = "/usr/lib/x86_64-linux-gnu"
LAYOUTS = {
    "debian-host": Layout(DEBIAN_X86_64, "/usr/bin", (DEBIAN_X86_64,)),
    "rhel-host": Layout("/usr/lib64", "/usr/bin", ("/lib64", "/usr/lib64")),
    # Named in /etc/ld.so.conf.d on GPU cloud images.
    "cloud-image": Layout("/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", ("/usr/local/nvidia/lib64",)),
    "gke": Layout(
        "/home/kubernetes/bin/nvidia/lib64",
        "/home/kubernetes/bin/nvidia/bin",
        ("/home/kubernetes/bin/nvidia/lib64",),
    ),
}


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_libraries(tmp_path_factory.mktemp("built"))


def mounted(root: Path, host_root: Path, machine: str = "x86_64") -> dict[str, str]:
    found = discover_driver(root, "unknown")
    assert found.version == VERSION
    assert found.missing == ()
    assert found.unusable == ()
    return {m.container_path: m.host_path for m in common_edits(found, (), host_root, machine).mounts}


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_is_mounted_where_both_loader_families_look(
    tmp_path: Path, libraries: Path, name: str
) -> None:
    layout = LAYOUTS[name]
    root = install(tmp_path / "root", libraries, layout)

    mounts = mounted(root, root)

    for container_dir in (DEBIAN_X86_64, "/usr/lib64"):
        for library in ("cuda", "nvidia-ml"):
            host_file = f"{root}{layout.library_dir}/lib{library}.so.{VERSION}"
            assert mounts[f"{container_dir}/lib{library}.so.1"] == host_file
            assert mounts[f"{container_dir}/lib{library}.so.{VERSION}"] == host_file
    for program in ("nvidia-smi", "nvidia-cuda-mps-control"):
        assert mounts[f"/usr/bin/{program}"] == f"{root}{layout.binary_dir}/{program}"
    assert not [path for path in mounts if path.startswith(("/usr/local", "/home"))]
    # Every library in each of the two directories; none is left out.
    assert {path for path in mounts if path.startswith("/usr/lib64/")} == {
        f"/usr/lib64/{file}"
        for library, suffix in SONAMES.items()
        for file in {f"lib{library}.so.{VERSION}", f"lib{library}.so.{suffix or VERSION}"}
    }


def test_the_gpu_operators_driver_root_is_named_as_the_host_sees_it(tmp_path: Path, libraries: Path) -> None:
    """The agent reads /driver-root; the runtime resolves /run/nvidia/driver on the host."""
    seen = install(tmp_path / "run/nvidia/driver", libraries, LAYOUTS["debian-host"])
    (seen / "dev").mkdir()

    mounts = mounted(seen, Path("/run/nvidia/driver"))

    host_file = f"/run/nvidia/driver{DEBIAN_X86_64}/libcuda.so.{VERSION}"
    assert mounts[f"{DEBIAN_X86_64}/libcuda.so.1"] == mounts["/usr/lib64/libcuda.so.1"] == host_file
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"


def test_on_aarch64_the_debian_directory_is_the_arm64_one(tmp_path: Path, libraries: Path) -> None:
    root = install(tmp_path / "root", libraries, LAYOUTS["cloud-image"])

    mounts = mounted(root, root, "aarch64")

    assert "/usr/lib/aarch64-linux-gnu/libcuda.so.1" in mounts
    assert "/usr/lib64/libcuda.so.1" in mounts
    assert not [path for path in mounts if "x86_64" in path]


def test_a_32_bit_copy_the_cache_names_first_is_passed_over(tmp_path: Path, libraries: Path) -> None:
    """The cache's string table is sorted, so /usr/local/nvidia/lib comes before .../lib64."""
    root = tmp_path / "root"
    build_libraries(root / "usr/local/nvidia/lib", bits=32)
    install(
        root,
        libraries,
        Layout(
            "/usr/local/nvidia/lib64",
            "/usr/local/nvidia/bin",
            ("/usr/local/nvidia/lib", "/usr/local/nvidia/lib64"),
        ),
    )
    cache = (root / "etc/ld.so.cache").read_bytes()
    assert cache.index(b"/usr/local/nvidia/lib/libcuda.so.1") < cache.index(
        b"/usr/local/nvidia/lib64/libcuda.so.1"
    )

    mounts = mounted(root, root)

    assert mounts["/usr/lib64/libcuda.so.1"] == f"{root}/usr/local/nvidia/lib64/libcuda.so.{VERSION}"


def test_a_cache_directory_that_climbs_out_of_the_root_is_refused(tmp_path: Path, libraries: Path) -> None:
    """ldconfig -r works chrooted, where `..` stops at the root; the driver's files are then
    looked for where the link really points, and refused."""
    root = tmp_path / "root"
    install(root, libraries, LAYOUTS["cloud-image"])
    (root / "usr/local/nvidia").rename(root / "elsewhere")
    (root / "usr/local/nvidia").symlink_to("../../../elsewhere")
    install(root, libraries, Layout("/elsewhere/lib64", "/usr/bin", ("/usr/local/nvidia/lib64",)))
    assert b"/usr/local/nvidia/lib64/libcuda.so.1" in (root / "etc/ld.so.cache").read_bytes()

    found = discover_driver(root, VERSION)

    assert UnusablePath("/usr/local/nvidia", "symlink climbs out of the driver root") in found.unusable
    assert f"libcuda.so.{VERSION}" in found.missing
    assert found.libraries == ()
