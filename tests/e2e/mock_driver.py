"""The mock NVIDIA driver of the kind e2e worker: the agent runs `--hardware nvml` on the mock
libnvidia-ml.so.1 (tests/mock_nvml), so the e2e run goes through the real NVML backend, the
driver root and the CDI specs a real node gets.

hack/kind-up.sh unpacks `archive` on the worker with `tar -x -C /` (as root in the node's
container, which can make device nodes; `docker cp` would drop them under rootless Docker):

    /run/mock-nvidia/driver          the driver root (chart value driverRoot, read-only in the pod)
      usr/lib/x86_64-linux-gnu/      the mock as libnvidia-ml.so.<version>, and its SONAME link
      usr/bin/                       stand-ins for the programs the agent runs (below); the MPS
                                     control daemon is dra_driver's simulated one
      dev/                           the device nodes CDI specs name: character devices with the
                                     numbers of /dev/null, so containerd can inject them and a
                                     workload that opens one reads nothing
    /run/dra-driver/mock-nvml        the mock's own files, in the agent's run directory (read-write,
      node.txt  sys/  proc/  faults/ and at the same path in the pod); the mock adds `state`

The node file is rendered for the worker's name from hack/e2e-node/simulated-node.yaml, so the
mock's GPUs are those `--hardware simulated:` would publish there (same UUIDs).

    python -m tests.e2e.mock_driver archive --node-name NAME --library FILE > mock.tar
"""

import argparse
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from dra_driver.hardware.driver_root import CONTROL_DEVICE_NODES
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.tools.manifests import DEFAULT_NAME
from tests.support.examples import E2E_HARDWARE_FILE
from tests.support.mock_nvml import make_driver_root, make_sysfs, render_node

DRIVER_ROOT = "/run/mock-nvidia/driver"
# In the agent's run directory (/run/<release name>), mounted read-write at the same path.
MOCK_DIR = f"/run/{DEFAULT_NAME}/mock-nvml"
NULL_DEVICE = (1, 3)
# mock_nvml.c's sync_capabilities hands out MIG capability minors 1 and 2 (config, monitor) and
# 1000 + 256 * <GPU's place in the node file> + 16 * <GPU instance id> + 1 + <compute instance id>.
CAPABILITY_MINORS_PER_GPU = 256
FIRST_GPU_CAPABILITY_MINOR = 1000
# What the agent runs of the driver: nvidia-smi sets a time slice for a TimeSlicing claim
# (deploy/examples/time-slicing-shared.yaml). The stand-in accepts that and refuses the rest.
NVIDIA_SMI = """\
#!/bin/sh
# nvidia-smi of the mock driver (kind e2e): a time slice setting is accepted and changes nothing.
if [ "${1:-}" = compute-policy ]; then
  echo "mock nvidia-smi: $*" >&2
  exit 0
fi
echo "mock nvidia-smi: only 'compute-policy' is stood in for" >&2
exit 1
"""


# The MPS control daemon: the simulated nvidia-cuda-mps-control, which speaks the real one's
# protocol on the pipe directory. The agent's image has the package, and both the agent and the
# MPS daemon pods (which run that image) run this program from the driver root.
NVIDIA_CUDA_MPS_CONTROL = """\
#!/bin/sh
# nvidia-cuda-mps-control of the mock driver (e2e): the simulated daemon of dra_driver.
exec python3 -m dra_driver.hardware.simulated_mps_control "$@"
"""


def mock_environment() -> dict[str, str]:
    """The agent's environment beyond the chart's own: where the mock finds its node and keeps its
    state, and the sysfs and procfs the agent reads in place of the node's (the GPUs' PCI devices,
    the MIG capability files the mock writes)."""
    return {
        "MOCK_NVML_NODE": f"{MOCK_DIR}/node.txt",
        "MOCK_NVML_STATE": f"{MOCK_DIR}/state",
        "MOCK_NVML_FAULTS": f"{MOCK_DIR}/faults",
        "MOCK_NVML_PROC": f"{MOCK_DIR}/proc",
        "DRA_DRIVER_SYSFS_ROOT": f"{MOCK_DIR}/sys",
        "DRA_DRIVER_PROC_ROOT": f"{MOCK_DIR}/proc",
    }


def device_nodes(node_name: str) -> list[str]:
    """Every device node a CDI spec of the agent can name on this node: the control nodes, one per
    GPU, and every MIG capability the mock can hand out."""
    gpus = simulated_gpus(node_name, resolve_node_spec(str(E2E_HARDWARE_FILE)))
    last_capability = FIRST_GPU_CAPABILITY_MINOR + CAPABILITY_MINORS_PER_GPU * len(gpus)
    return [
        *CONTROL_DEVICE_NODES,
        *(f"/dev/nvidia{gpu.minor}" for gpu in gpus),
        *(f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in range(1, last_capability)),
    ]


def lay_out(root: Path, node_name: str, library: Path) -> None:
    """The files of the archive (all but the device nodes) below `root` standing for `/`."""
    spec = resolve_node_spec(str(E2E_HARDWARE_FILE))
    driver_root = root / DRIVER_ROOT.lstrip("/")
    make_driver_root(driver_root, spec.driver_version, library)
    (driver_root / "usr/bin/nvidia-smi").write_text(NVIDIA_SMI)
    (driver_root / "usr/bin/nvidia-cuda-mps-control").write_text(NVIDIA_CUDA_MPS_CONTROL)
    mock = root / MOCK_DIR.lstrip("/")
    mock.mkdir(parents=True)
    (mock / "node.txt").write_text(render_node(node_name, spec))
    make_sysfs(mock / "sys", simulated_gpus(node_name, spec))
    for directory in ("proc", "faults"):
        (mock / directory).mkdir()


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def archive(node_name: str, library: Path, out: BinaryIO) -> None:
    """The mock driver for node `node_name` as a tar stream of paths relative to `/`."""
    with tempfile.TemporaryDirectory() as staging, tarfile.open(fileobj=out, mode="w|") as tar:
        root = Path(staging)
        lay_out(root, node_name, library)
        tops = [root / DRIVER_ROOT.lstrip("/"), root / MOCK_DIR.lstrip("/")]
        # Not /run and the like: unpacking would set their owner and mode on the worker.
        paths = [path for path in sorted(root.rglob("*")) if any(path.is_relative_to(top) for top in tops)]
        for path in paths:
            info = _root_owned(tar.gettarinfo(str(path), arcname=str(path.relative_to(root))))
            if info.issym() and Path(info.linkname).is_relative_to(root):
                # make_sysfs links absolutely: to the same place on the worker.
                info.linkname = f"/{Path(info.linkname).relative_to(root)}"
            if info.isreg():
                with path.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
        dev = f"{DRIVER_ROOT}/dev".lstrip("/")
        for directory in (dev, f"{dev}/nvidia-caps"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(_root_owned(info))
        for node in device_nodes(node_name):
            info = tarfile.TarInfo(f"{DRIVER_ROOT}{node}".lstrip("/"))
            info.type, info.mode = tarfile.CHRTYPE, 0o666
            info.devmajor, info.devminor = NULL_DEVICE
            tar.addfile(_root_owned(info))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.mock_driver", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=("archive",))
    parser.add_argument("--node-name", required=True, help="the worker's Kubernetes node name")
    parser.add_argument("--library", required=True, type=Path, help="the mock libnvidia-ml.so.1, built")
    args = parser.parse_args(argv)
    if not args.library.is_file():
        print(f"python -m tests.e2e.mock_driver: --library {args.library}: not a file", file=sys.stderr)
        return 2
    archive(args.node_name, args.library, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
