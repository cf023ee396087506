"""A container loads the driver's libraries by SONAME from the node's CDI spec, wherever the
host keeps them: in a GPU cloud image's /usr/local/nvidia/lib64, which only the root's loader
cache names, or in a RHEL host's /usr/lib64; the container is a Debian-family one, whose loader
searches neither.

The container's root is built from this machine's own C library and loader (Debian's: it
searches /lib/<triplet> and /usr/lib/<triplet>), with its own loader cache, and a program that
dlopen()s each name given and prints which file answered.
"""

import platform
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from dra_driver.claims.edits.cdi import common_device_id
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.driver_edits import common_edits
from dra_driver.hardware.driver_root import discover_driver
from dra_driver.tools import podman
from tests.support import podman_tier
from tests.support.driver_trees import (
    VERSION,
    Layout,
    build_libraries,
    compile_c,
    install,
    write_loader_cache,
)

pytestmark = pytest.mark.podman

_PROBE = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        void *library = dlopen(argv[i], RTLD_NOW);
        const char *(*which)(void) = library ? (const char *(*)(void))dlsym(library, "dra_test_library") : 0;
        printf("%s: %s\n", argv[i], which ? which() : dlerror());
        failed |= which == 0;
    }
    return failed;
}
"""


def debian_family_rootfs(rootfs: Path) -> Path:
    """The probe with the loader and C library it was linked against, each where this machine
    has it, busybox for a shell, and a loader cache of the root's own (naming no driver)."""
    probe = compile_c(_PROBE, rootfs / "probe")
    linked = subprocess.run(["ldd", str(probe)], capture_output=True, text=True, check=True).stdout
    for path in re.findall(r"(/\S+) \(0x", linked):
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(path).resolve(), target)
    (rootfs / "bin").mkdir()
    shutil.copy2(podman.BUSYBOX, rootfs / "bin" / "sh")
    write_loader_cache(rootfs, ())
    return rootfs


LAYOUTS = {
    "cloud-image": Layout("/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", ("/usr/local/nvidia/lib64",)),
    "rhel-host": Layout("/usr/lib64", "/usr/bin", ("/usr/lib64",)),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_debian_container_loads_the_driver_by_soname(tmp_path: Path, name: str) -> None:
    podman_tier.require_podman()
    layout = LAYOUTS[name]
    root = install(tmp_path / "driver", build_libraries(tmp_path / "built"), layout)
    rootfs = debian_family_rootfs(tmp_path / "rootfs")
    assert b"libcuda" not in (rootfs / "etc/ld.so.cache").read_bytes()
    # A driver name of this test run's own: the spec lands in the runtime's real CDI directory.
    driver = f"n{secrets.token_hex(4)}.podman-test.dra-driver.dev"
    edits = common_edits(discover_driver(root, VERSION), (), root, platform.machine())
    spec_path = CdiSpecDirectory(podman.CDI_DIRS[1], driver).write_node_spec(edits)
    try:
        seen = podman.run_with_cdi_devices(
            [common_device_id(driver)],
            # Everything on stdout, and exit 0: a failure shows as what the container saw.
            "/probe libcuda.so.1 libnvidia-ml.so.1; /usr/bin/nvidia-smi 2>&1; exit 0",
            rootfs=rootfs,
        )
    finally:
        spec_path.unlink()

    assert seen.splitlines() == [
        f"libcuda.so.1: libcuda.so.{VERSION}",
        f"libnvidia-ml.so.1: libnvidia-ml.so.{VERSION}",
        "nvidia-smi",
    ]
