"""The node: containerd with CDI and the images imported, the pod network's CNI config, the mock
NVIDIA driver the agent's real NVML backend loads, and kubelet registered as a Ready Node.
"""

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, cast

from tests.cluster import configs, processes
from tests.cluster.layout import (
    API_ADDRESS,
    BRIDGE,
    BRIDGE_PREFIX,
    CGROUP_ROOT,
    HOST_CDI_DIR,
    KUBE_PROXY_HEALTHZ_PORT,
    KUBE_PROXY_METRICS_PORT,
    KUBELET_HEALTHZ_PORT,
    NODE_NAME,
    POD_SUBNET,
    Layout,
)
from tests.cluster.versions import KubernetesVersion
from tests.e2e import mock_driver


class NodeError(Exception):
    pass


def _path_with(*directories: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([*(str(directory) for directory in directories), env.get("PATH", "")])
    return env


def _ip(*args: str) -> None:
    completed = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise NodeError(f"ip {' '.join(args)} exited {completed.returncode}: {completed.stderr.strip()}")


def make_bridge() -> None:
    """The pod network's bridge with its gateway address, before anything listens there; the
    bridge CNI plugin adopts it when the first pod starts."""
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "replace", f"{API_ADDRESS}/{BRIDGE_PREFIX}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def kube_proxy_argv(layout: Layout, binaries: Mapping[str, Path]) -> list[str]:
    """iptables mode, as a node has it by default; conntrack limits left as the machine has them
    (`--conntrack-max-per-core=0`), since a test cluster has no business changing them."""
    return [
        str(binaries["kube-proxy"]),
        f"--kubeconfig={layout.kubeconfig('kube-proxy')}",
        f"--hostname-override={NODE_NAME}",
        f"--cluster-cidr={POD_SUBNET}",
        "--proxy-mode=iptables",
        "--conntrack-max-per-core=0",
        f"--healthz-bind-address=127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        f"--metrics-bind-address=127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
    ]


def start_kube_proxy(layout: Layout, binaries: Mapping[str, Path]) -> None:
    processes.start(layout, "kube-proxy", kube_proxy_argv(layout, binaries))
    url = f"http://127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}/healthz"
    processes.wait_until("healthy", lambda: processes.http_ok(url), 120, layout, "kube-proxy")


def ctr(layout: Layout, binaries: Mapping[str, Path], *args: str) -> str:
    argv = [str(binaries["ctr"]), "--address", str(layout.containerd_socket), "--namespace", "k8s.io", *args]
    completed = subprocess.run(argv, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise NodeError(f"ctr {' '.join(args)} exited {completed.returncode}: {completed.stderr.strip()}")
    return completed.stdout


def containerd_argv(layout: Layout, binaries: Mapping[str, Path]) -> list[str]:
    return [str(binaries["containerd"]), "--config", str(layout.containerd_config)]


def start_containerd(layout: Layout, binaries: Mapping[str, Path]) -> None:
    """containerd finds its runc shim on the PATH, so the built one's directory comes first."""
    layout.containerd.mkdir(parents=True, exist_ok=True)
    layout.cdi_dir.mkdir(parents=True, exist_ok=True)
    layout.containerd_config.write_text(
        configs.containerd_config(
            layout, binaries["runc"], binaries["bridge"].parent, [layout.cdi_dir, HOST_CDI_DIR]
        )
    )
    layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    (layout.cni_conf_dir / "10-dra-e2e.conflist").write_text(configs.cni_conflist(layout))
    processes.start(
        layout, "containerd", containerd_argv(layout, binaries), _path_with(binaries["containerd"].parent)
    )

    def answers() -> bool:
        try:
            ctr(layout, binaries, "version")
        except NodeError:
            return False
        return True

    processes.wait_until("serving", answers, 60, layout, "containerd")


def import_images(layout: Layout, binaries: Mapping[str, Path], tars: list[Path]) -> None:
    for tar in tars:
        ctr(layout, binaries, "images", "import", "--no-unpack=false", str(tar))


def install_mock_driver(library: Path) -> None:
    """The mock driver as kind's worker has it (tests/e2e/mock_driver.py): the driver root under
    /run/mock-nvidia/driver with its device nodes, the mock's node file in the agent's run
    directory /run/dra-driver."""
    with tempfile.TemporaryFile() as stream:
        mock_driver.archive(NODE_NAME, library, cast(BinaryIO, stream))
        stream.seek(0)
        unpacked = subprocess.run(
            ["tar", "-x", "-f", "-", "-C", "/"], stdin=stream, capture_output=True, check=False
        )
    if unpacked.returncode != 0:
        raise NodeError(f"unpacking the mock driver failed: {unpacked.stderr.decode().strip()}")
    # The chart mounts the driver root with HostToContainer propagation (the GPU Operator's
    # driver container may mount it later), which containerd allows only from a shared or slave
    # mount. A systemd host's / is shared; this VM's is private, so the driver root becomes a
    # shared mount of its own, as the Operator's driver directory is.
    for argv in (
        ["mount", "--bind", mock_driver.DRIVER_ROOT, mock_driver.DRIVER_ROOT],
        ["mount", "--make-rshared", mock_driver.DRIVER_ROOT],
    ):
        completed = subprocess.run(argv, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise NodeError(f"{' '.join(argv)} exited {completed.returncode}: {completed.stderr.strip()}")


def kubelet_argv(layout: Layout, binaries: Mapping[str, Path]) -> list[str]:
    return [
        str(binaries["kubelet"]),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={API_ADDRESS}",
        "--v=2",
    ]


def make_cgroup_root() -> None:
    """kubelet wants its cgroup root to exist in every hierarchy before it starts."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if (hierarchy / "cgroup.procs").exists():
            (hierarchy / CGROUP_ROOT).mkdir(exist_ok=True)


def start_kubelet(layout: Layout, binaries: Mapping[str, Path], version: KubernetesVersion) -> None:
    layout.kubelet_root.mkdir(parents=True, exist_ok=True)
    make_cgroup_root()
    layout.kubelet_config.write_text(configs.kubelet_config(layout, version.feature_gates))
    # kubelet runs mount, umount and the like from the PATH; nothing of ours is needed there.
    processes.start(layout, "kubelet", kubelet_argv(layout, binaries))
    url = f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz"
    processes.wait_until("healthy", lambda: processes.http_ok(url), 120, layout, "kubelet")


def node_ready(kubectl: list[str]) -> bool:
    completed = subprocess.run(
        [*kubectl, "get", "node", NODE_NAME, "-o", "json"], capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        return False
    conditions = json.loads(completed.stdout).get("status", {}).get("conditions", [])
    return any(item["type"] == "Ready" and item["status"] == "True" for item in conditions)
