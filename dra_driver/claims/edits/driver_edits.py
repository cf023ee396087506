"""The CDI edits that hand the driver found under a driver root to every GPU container.

Discovery (hardware/driver_root.py) sits below the claims layer, which owns the CDI model; this
module is where the two meet.

Where a container sees the driver's libraries is decided here, not by where the host keeps them.
A library mounted into the container is not in the image's loader cache, so the container's
loader finds it only in its built-in directories, and those depend on the image's C library
family, not the host's: Debian and Ubuntu's glibc searches /lib/<triplet>, /usr/lib/<triplet>,
/lib and /usr/lib; RHEL, Fedora and SUSE's searches /lib64 and /usr/lib64. A library mounted where
the host had it (/usr/local/nvidia/lib64 on GPU cloud images, /usr/lib64 on a RHEL host seen from
an Ubuntu container) is then invisible to programs that load libcuda.so.1 by name. So every
library is mounted into the standard directory of both families for the node's architecture
(/usr/lib/x86_64-linux-gnu and /usr/lib64 on x86_64, /usr/lib/aarch64-linux-gnu and /usr/lib64 on
aarch64), under its versioned file name and its SONAME, and every program into /usr/bin, whatever
directories the host used. The alternatives fail somewhere: a CDI hook running ldconfig needs a
host binary in every runtime's reach, and LD_LIBRARY_PATH would replace the image's own.
"""

from pathlib import Path, PurePosixPath

from dra_driver.claims.edits.cdi import ContainerEdits, DeviceNode, Mount
from dra_driver.hardware.driver_root import (
    CONTROL_DEVICE_NODES,
    OPTIONAL_DEVICE_NODES,
    READ_ONLY_BIND,
    DeviceRoot,
    DriverDiscovery,
)

# The Debian-family directory of each architecture NVIDIA ships drivers for.
_MULTIARCH_LIBRARY_DIRS = {
    "x86_64": "/usr/lib/x86_64-linux-gnu",
    "aarch64": "/usr/lib/aarch64-linux-gnu",
}
CONTAINER_BINARY_DIR = "/usr/bin"


def container_library_dirs(machine: str) -> tuple[str, ...]:
    """Where containers get the driver's libraries on a node whose `machine` (`uname -m`) is
    given: the directory each glibc family's loader searches. On another architecture, /usr/lib
    stands in for the unknown multiarch directory (Debian's loader searches it too)."""
    return (_MULTIARCH_LIBRARY_DIRS.get(machine, "/usr/lib"), "/usr/lib64")


def control_device_nodes(dev_root: DeviceRoot) -> tuple[DeviceNode, ...]:
    """The device nodes every GPU container opens, named as the host has them below
    `dev_root.host`; the optional ones only where the agent sees them."""
    optional = [path for path in OPTIONAL_DEVICE_NODES if dev_root.seen.joinpath(path[1:]).exists()]
    return tuple(DeviceNode.under(dev_root.host, path) for path in (*CONTROL_DEVICE_NODES, *optional))


def common_edits(
    discovery: DriverDiscovery, device_nodes: tuple[DeviceNode, ...], host_root: Path, machine: str
) -> ContainerEdits:
    """The node-wide edits: `device_nodes` and read-only bind mounts of every file found.

    Libraries go to `container_library_dirs(machine)` under both their names, programs to
    /usr/bin, firmware where the driver's kernel module and tools expect it (its own path). The
    host side of a mount is the resolved file, never a symlink the runtime would follow on the
    host, outside the driver root. It is named below `host_root`, the driver root as the host
    sees it: the runtime resolves it on the host, where the agent's own view of the driver root
    (`discovery.root`, a mount in its container) does not exist.
    """
    mounts = []

    def mount(host_file: str, container_path: str) -> None:
        mounts.append(Mount(str(host_root.joinpath(host_file[1:])), container_path, READ_ONLY_BIND))

    for library in discovery.libraries:
        names = [PurePosixPath(library.path).name, *([library.soname] if library.soname else [])]
        for directory in container_library_dirs(machine):
            for name in names:
                mount(library.resolved, f"{directory}/{name}")
    for binary in discovery.binaries:
        mount(binary.resolved, f"{CONTAINER_BINARY_DIR}/{PurePosixPath(binary.path).name}")
    for firmware in discovery.firmware:
        mount(firmware.resolved, firmware.path)
    return ContainerEdits(device_nodes=device_nodes, mounts=tuple(mounts))
