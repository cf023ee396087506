"""Where everything of a running cluster lives: one directory, so that tearing the cluster down
is removing it (after its processes, mounts, network and cgroups are gone).

The node agent, when it runs as the chart's DaemonSet pod, keeps the chart's host paths
(/run/<release> and /var/run/cdi): those are the chart's, and cluster-down removes what the
agent left there.
"""

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/tmp/dra-e2e")
NODE_NAME = "dra-e2e-node"
# The bridge CNI's device and subnet: addresses inside network namespaces the cluster makes.
BRIDGE = "dra-e2e0"
POD_SUBNET = "10.88.0.0/16"
# The bridge's own address, made before the control plane starts: the API server listens there
# and nowhere else. A loopback address would do for the host's clients, but the API server
# refuses to advertise one, and pods reach the `kubernetes` Service's endpoint through kube-proxy
# only at an address their network namespace can route to: the bridge's.
API_ADDRESS = "10.88.0.1"
BRIDGE_PREFIX = 16
SERVICE_RANGE = "10.0.0.0/24"
# kubelet's cgroup root in every hierarchy: the pods' cgroups, removed by cluster-down.
CGROUP_ROOT = "dra-e2e"
# Loopback ports; the components' defaults, so logs and docs read as upstream's do.
API_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
CONTROLLER_MANAGER_PORT = 10257
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBE_PROXY_METRICS_PORT = 10249
SCHEDULER_PORT = 10259
# The chart's hostPath of the agent's CDI specs.
HOST_CDI_DIR = Path("/var/run/cdi")


@dataclass(frozen=True, slots=True)
class Layout:
    root: Path

    @classmethod
    def from_environment(cls) -> "Layout":
        """DRA_DRIVER_CLUSTER_DIR, else /tmp/dra-e2e. Short on purpose: the agent's sockets in
        kubelet's plugin directory carry a pod UID, and gRPC binds at most 105 bytes of path."""
        return cls(Path(os.environ.get("DRA_DRIVER_CLUSTER_DIR") or DEFAULT_ROOT))

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    def kubeconfig(self, user: str) -> Path:
        return self.root / "kubeconfig" / f"{user}.kubeconfig"

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.containerd / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.root / "cni" / "networks"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def registrar_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def pod_resources_dir(self) -> Path:
        return self.kubelet_root / "pod-resources"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def agent(self) -> Path:
        """The host-process agent's state, run and MPS directories."""
        return self.root / "agent"

    @property
    def environment_file(self) -> Path:
        """The `export` lines `make cluster` prints, for a later shell or test run."""
        return self.root / "env.sh"
