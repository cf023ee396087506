"""The CDI edits that hand the driver found under a driver root to every GPU container.

Discovery (hardware/driver_root.py) sits below the claims layer, which owns the CDI model; this
module is where the two meet.
"""

from pathlib import Path

from dra_driver.claims.cdi import ContainerEdits, DeviceNode, Mount
from dra_driver.hardware.driver_root import (
    CONTROL_DEVICE_NODES,
    OPTIONAL_DEVICE_NODES,
    READ_ONLY_BIND,
    DeviceRoot,
    DriverDiscovery,
)


def control_device_nodes(dev_root: DeviceRoot) -> tuple[DeviceNode, ...]:
    """The device nodes every GPU container opens, named as the host has them below
    `dev_root.host`; the optional ones only where the agent sees them."""
    optional = [path for path in OPTIONAL_DEVICE_NODES if dev_root.seen.joinpath(path[1:]).exists()]
    return tuple(DeviceNode.under(dev_root.host, path) for path in (*CONTROL_DEVICE_NODES, *optional))


def common_edits(
    discovery: DriverDiscovery, device_nodes: tuple[DeviceNode, ...], host_root: Path
) -> ContainerEdits:
    """The node-wide edits: `device_nodes` and read-only bind mounts of every file found.

    Each file is mounted where it was found, one of the usual directories, and each library a
    second time at its SONAME path (libcuda.so.1), the name programs and the dynamic loader ask
    for. So no hook has to run ldconfig in the container: when the loader's cache does not know a
    library it looks in its built-in directories, which are the usual ones (a container whose
    distribution uses other directories than the driver root needs them in LD_LIBRARY_PATH).
    The host side of a mount is the resolved file, never a symlink the runtime would follow on
    the host, outside the driver root. It is named below `host_root`, the driver root as the host
    sees it: the runtime resolves it on the host, where the agent's own view of the driver root
    (`discovery.root`, a mount in its container) does not exist.
    """
    mounts = []
    for file in (*discovery.libraries, *discovery.binaries, *discovery.firmware):
        host_path = str(host_root.joinpath(file.resolved[1:]))
        mounts.append(Mount(host_path, file.path, READ_ONLY_BIND))
        if file.soname_path:
            mounts.append(Mount(host_path, file.soname_path, READ_ONLY_BIND))
    return ContainerEdits(device_nodes=device_nodes, mounts=tuple(mounts))
