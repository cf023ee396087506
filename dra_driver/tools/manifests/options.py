"""What `dra-driver manifests` and the chart values are rendered from: the options, their defaults,
and the labels and metadata every object carries."""

from collections.abc import Mapping
from typing import Any

import msgspec

from dra_driver import DEFAULT_DRIVER_NAME, __version__
from dra_driver.base.kubernetes_versions import DEFAULT_KUBERNETES
from dra_driver.config.option_table import (
    DEFAULT_DRIVER_ROOT,
    DEFAULT_HARDWARE,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRAR_DIR,
)
from dra_driver.config.settings import SettingsError
from dra_driver.devices.classes import APP_NAME

# What the documented build tags (the Dockerfile's header: `docker build -t dra-driver:<version> .`);
# the default names the one a user builds from a checkout, and the operator points --image
# (image.repository in the chart) at the registry the nodes pull from. A release pushes
# ghcr.io/<owner>/dra-driver:<version> and its chart names that (hack/release-chart.sh).
DEFAULT_IMAGE = f"dra-driver:{__version__}"
DEFAULT_NAME = APP_NAME
DEFAULT_NAMESPACE = "dra-driver"
DEFAULT_PRIORITY_CLASS = "system-node-critical"
DEFAULT_METRICS_PORT = int(DEFAULT_METRICS_ADDRESS.rpartition(":")[2])
LOG_FORMATS = ("json", "console")
# Nodes with an NVIDIA PCI device (Node Feature Discovery) or labelled by the GPU Operator.
GPU_NODE_LABELS: tuple[tuple[str, str], ...] = (
    ("feature.node.kubernetes.io/pci-10de.present", "true"),
    ("nvidia.com/gpu.present", "true"),
)
DEFAULT_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
# The longest suffix added to --name (`-simulated-node`) must still give a DNS label.
NAME_MAX = 63 - len("-simulated-node")

# The claim of a pod-bound service-account token that names the pod's node.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

CONTAINER_DRIVER_ROOT = "/driver-root"
# Where the ConfigMaps appear in the agent's container.
NODE_CONFIGS_DIR = "/etc/dra-driver/node-configs"
SIMULATED_NODE_DIR = "/etc/dra-driver/simulated-node"
SIMULATED_NODE_KEY = "simulated-node.yaml"
# The node config a node without the config label uses.
DEFAULT_NODE_CONFIG = "default"
# GPU usage metrics: seconds between samples, kubelet's PodResources directory, and the pods' log
# directories (pod names by UID) that attributing processes to pods reads.
DEFAULT_USAGE_INTERVAL = 10
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
POD_LOGS_DIR = "/var/log/pods"


class ManifestError(SettingsError):
    """A bad option; the message names the `dra-driver manifests` flag it came from."""


class ManifestOptions(msgspec.Struct, frozen=True):
    # The installation's name (a Helm release's name): names the namespaced objects and pods.
    name: str = DEFAULT_NAME
    driver_name: str = DEFAULT_DRIVER_NAME
    image: str = DEFAULT_IMAGE
    namespace: str = DEFAULT_NAMESPACE
    # "nvml", or "simulated:<profile>" for a test cluster without GPUs.
    hardware: str = DEFAULT_HARDWARE
    # Empty: the agent runs on GPU nodes (GPU_NODE_LABELS, as node affinity); else only there.
    node_selector: Mapping[str, str] = msgspec.field(default_factory=dict)
    # 1: the new agent pod overlaps the old one (kubelet >= 1.33); 0: old goes, then new starts.
    max_surge: int = 1
    # Named node configs (how GPUs are offered: whole, MIG, vGPU) as YAML text, by config name.
    node_configs: Mapping[str, str] = msgspec.field(default_factory=dict)
    # A simulated node description (YAML text) for `--hardware simulated:<file>`.
    simulated_node: str | None = None
    # HAMi-core's libvgpu.so on the hosts, which enforces vGPU limits; None: advisory limits.
    hami_core_library: str | None = None
    # Where the NVIDIA driver is on the hosts: "/" or the GPU Operator's /run/nvidia/driver.
    driver_root: str = DEFAULT_DRIVER_ROOT
    registrar_dir: str = DEFAULT_REGISTRAR_DIR
    plugins_dir: str = DEFAULT_PLUGINS_DIR
    # "" leaves the pods without a priority class.
    priority_class_name: str = DEFAULT_PRIORITY_CLASS
    log_verbosity: int = 0
    log_format: str = "json"
    metrics_port: int = DEFAULT_METRICS_PORT
    # More environment for the agent's container, after its own (e.g. a test library's settings).
    extra_env: Mapping[str, str] = msgspec.field(default_factory=dict)
    # The oldest Kubernetes ("1.N") the objects must work on; gates options that need newer ones.
    kubernetes_version: str = DEFAULT_KUBERNETES
    # Serve the NVIDIA device plugin's resource names from the DeviceClasses (needs 1.36+).
    extended_resources: bool = False
    # MIG profiles served as nvidia.com/mig-<profile>; empty: every profile of the GPU catalog.
    extended_mig_profiles: tuple[str, ...] = ()
    # Seconds between GPU usage samples; 0: no usage metrics (and no PodResources mount).
    usage_interval: int = DEFAULT_USAGE_INTERVAL
    # Attribute GPU processes to pods by cgroup: the host PID namespace and /var/log/pods.
    usage_processes: bool = False
    # Flush each claim record to disk before kubelet's answer (--flush-records).
    flush_records: bool = False
    # Refuse claim shapes prepare would refuse when they are created (claim_rules.py).
    claim_policy: bool = True


def selector_labels(options: ManifestOptions) -> dict[str, str]:
    """What the DaemonSet selects its pods by: the app and the installation."""
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": options.name}


def common_labels(options: ManifestOptions) -> dict[str, str]:
    return {**selector_labels(options), "app.kubernetes.io/version": __version__}


def object_metadata(options: ManifestOptions, name: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = common_labels(options)
    return metadata
