"""The components' configuration files, rendered from the cluster's layout: pure text, so a unit
test can read each setting and the reason it is there.
"""

import json
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.images import PAUSE_IMAGE
from tests.cluster.layout import (
    API_ADDRESS,
    BRIDGE,
    CGROUP_ROOT,
    KUBELET_HEALTHZ_PORT,
    KUBELET_PORT,
    POD_SUBNET,
    Layout,
)

NETWORK_NAME = "dra-e2e"


def kubeconfig(
    server: str, ca: Path, certificate: Path | None, key: Path | None, token: str | None = None
) -> str:
    """A kubeconfig of one cluster, user and context: a client certificate, or a bearer token (the
    agent's ServiceAccount token from the TokenRequest API)."""
    user: dict[str, str] = {}
    if certificate is not None and key is not None:
        user = {"client-certificate": str(certificate), "client-key": str(key)}
    if token is not None:
        user["token"] = token
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    return yaml.safe_dump(document, sort_keys=False)


def containerd_config(layout: Layout, runc: Path, cni_bin: Path, cdi_dirs: list[Path]) -> str:
    """containerd's version-3 configuration.

    `root`, `state` and `version` come before the first table: after a header every key belongs
    to that table, and containerd would silently fall back to /var/lib/containerd.
    `restrict_oom_score_adj`: these VMs refuse to lower a process's oom_score_adj, even to root,
    and the CRI plugin sets -998 on every sandbox, which makes runc fail with "can't get final
    child's PID from pipe". `netns_mounts_under_state_dir`: pods' network namespaces in the
    cluster's directory, not /var/run/netns. NRI is off, so no socket in /var/run/nri.
    """
    root = layout.containerd
    dirs = ", ".join(f"'{directory}'" for directory in cdi_dirs)
    return f"""\
version = 3
root = '{root / "root"}'
state = '{root / "state"}'

[grpc]
  address = '{layout.containerd_socket}'

[ttrpc]
  address = '{layout.containerd_socket}.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '{root / "opt"}'

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE_IMAGE}'

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [{dirs}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{runc}'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{cni_bin}']
    conf_dir = '{layout.cni_conf_dir}'
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"""


def cni_conflist(layout: Layout) -> str:
    """A bridge on a subnet inside the machine, IP masquerading off: pods get addresses in network
    namespaces containerd makes, and no traffic is routed off the machine. host-local keeps its
    leases in the cluster's directory."""
    document = {
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    # Without a default route a pod reaches nothing off its subnet, the
                    # `kubernetes` Service's address among it.
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.cni_data_dir),
                },
            },
            {"type": "loopback"},
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def kubelet_config(layout: Layout, feature_gates: dict[str, bool]) -> str:
    """kubelet's configuration for a VM with cgroup v1, no swap accounting and no systemd.

    `failCgroupV1: false`: from 1.35 kubelet refuses cgroup v1 unless told (1.34 has the field
    already, off by default). `cgroupRoot`: the
    pods' cgroups under one parent of the cluster's own, which cluster-down removes.
    `oomScoreAdj: 0`: lowering it is refused here. Authentication by client certificate (the API
    server's kubelet client) and webhook; authorization by webhook, as a real node has it.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The node's address: the API server reaches kubelet there (logs, exec), and kubelet
        # refuses a loopback node IP.
        "address": API_ADDRESS,
        "port": KUBELET_PORT,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "staticPodPath": "",
        "podLogsDir": str(layout.root / "pod-logs"),
        "featureGates": feature_gates,
        # Image GC would only delete images nothing can pull again.
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "resolvConf": "",
        "serializeImagePulls": False,
        "podPidsLimit": -1,
        "localStorageCapacityIsolation": False,
        "failCgroupV1": False,
    }
    return yaml.safe_dump(config, sort_keys=False)
