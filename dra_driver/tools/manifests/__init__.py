"""Everything a cluster needs to run the driver, rendered as plain dicts: `dra-driver manifests`.

The objects are rendered rather than written by hand because several of them name the same
things (driver name, namespace, service account), and a hand-edited copy that renames one but not
the others fails only in the cluster, as a permission error or a policy that never matches.
deploy/dra-driver.yaml is the default rendering, and a test fails when the two differ.

Choices a reader of the YAML cannot see the reasons for:

- RBAC is the least the agent uses: it reads the claims it prepares and its own Node, owns its
  ResourceSlices and records events. A ClusterRole cannot say "only this node's slices", so a
  ValidatingAdmissionPolicy does: the agent's service account may write only ResourceSlices whose
  `spec.nodeName` is the node its pod-bound token names. A compromised agent on one node then
  cannot hide or forge another node's devices.
- The DaemonSet rolls out with `maxSurge: 1, maxUnavailable: 0`: the new agent pod starts next
  to the old one, so the node never stops preparing claims. Each pod names its sockets by its UID
  (POD_UID from the downward API) and kubelet (>= 1.33) calls the newest; the two share the state
  directory under file locks, and one of them publishes. `--max-surge 0` replaces the pods one
  after the other instead, for kubelets older than 1.33, which keep one registration per driver.
- The container is privileged because it opens /dev/nvidia* and creates MIG instances;
  NVIDIA_VISIBLE_DEVICES=void keeps the NVIDIA container runtime (where it is the default runtime)
  from injecting GPUs and driver files into the agent, which reads them from the driver root.
- The driver root (`--driver-root`: `/` for a driver installed on the host, /run/nvidia/driver
  for the GPU Operator's driver container) is mounted read-only at /driver-root with
  HostToContainer propagation and type DirectoryOrCreate, because the Operator mounts the driver
  there after the agent may have started; the agent waits for it. The MPS directory is under
  /run, a tmpfs on the host, mounted at the same path because workload containers get its
  subdirectories from CDI.
- `--name` is the installation's name (the Helm chart's release name): the DaemonSet, service
  account and ConfigMaps are named after it, the pods carry it as `app.kubernetes.io/instance`
  in the DaemonSet's selector, and the host directories of the agent (/run/<name>,
  /var/lib/<name>) carry it too; cluster-scoped objects are named after the driver name. Two
  installations with different names and driver names therefore share no object.
- Node configs travel in the ConfigMap `<name>-node-configs`, one key `<config>.yaml` each; the
  agent picks the one its Node's label names. Each is parsed here, so a broken one fails the
  rendering instead of every agent.
- `--extended-resources` (chart: `extendedResources.enabled`) makes the DeviceClasses serve the
  NVIDIA device plugin's resource names (devices/extended_resources.py). It is refused unless
  `--kubernetes-version` is 1.36 or later (the chart reads the cluster's version), because older
  API servers drop the field silently and the pods would wait forever.
- deploy/helm/dra-driver renders the same objects from values (tests/api/test_helm_chart.py
  installs it with real Helm and compares), plus Helm's own labels.
"""

from dra_driver.config.option_table import (
    DEFAULT_DRIVER_ROOT,
    DEFAULT_HARDWARE,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRAR_DIR,
)
from dra_driver.tools.manifests.access import service_account_name, service_account_username
from dra_driver.tools.manifests.chart import chart_values
from dra_driver.tools.manifests.objects import render, render_yaml
from dra_driver.tools.manifests.options import (
    CONTAINER_DRIVER_ROOT,
    DEFAULT_IMAGE,
    DEFAULT_METRICS_PORT,
    DEFAULT_NAME,
    DEFAULT_NAMESPACE,
    DEFAULT_PRIORITY_CLASS,
    DEFAULT_USAGE_INTERVAL,
    LOG_FORMATS,
    NODE_NAME_EXTRA,
    ManifestError,
    ManifestOptions,
    selector_labels,
)
from dra_driver.tools.manifests.validation import (
    label_problem,
    node_config_name_problem,
    parse_env,
    parse_node_selector,
    split_node_config_argument,
)

__all__ = [
    "CONTAINER_DRIVER_ROOT",
    "DEFAULT_DRIVER_ROOT",
    "DEFAULT_HARDWARE",
    "DEFAULT_IMAGE",
    "DEFAULT_METRICS_PORT",
    "DEFAULT_NAME",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PLUGINS_DIR",
    "DEFAULT_PRIORITY_CLASS",
    "DEFAULT_REGISTRAR_DIR",
    "DEFAULT_USAGE_INTERVAL",
    "LOG_FORMATS",
    "NODE_NAME_EXTRA",
    "ManifestError",
    "ManifestOptions",
    "chart_values",
    "label_problem",
    "node_config_name_problem",
    "parse_env",
    "parse_node_selector",
    "render",
    "render_yaml",
    "selector_labels",
    "service_account_name",
    "service_account_username",
    "split_node_config_argument",
]
