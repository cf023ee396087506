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
- The container is privileged because it opens /dev/nvidia* and creates MIG instances.
- The NVIDIA driver's files are expected under /run/nvidia/driver (the GPU operator's driver
  container), mounted read-only at /driver-root; the MPS directory is under /run, a tmpfs on the
  host, mounted at the same path because workload containers get its subdirectories from CDI.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME, __version__
from dra_driver.devices.classes import APP_NAME, device_classes
from dra_driver.k8s_names import dns_label_problem, dns_subdomain_problem, driver_name_problem, shown
from dra_driver.settings import DEFAULT_METRICS_ADDRESS, SettingsError, parse_hardware

DEFAULT_IMAGE = f"ghcr.io/dra-driver/dra-driver:{__version__}"
DEFAULT_NAMESPACE = "dra-driver"
DEFAULT_HARDWARE = "nvml"
DEFAULT_NODE_SELECTOR: Mapping[str, str] = {"nvidia.com/gpu.present": "true"}

SERVICE_ACCOUNT = "dra-driver"
METRICS_PORT = int(DEFAULT_METRICS_ADDRESS.rpartition(":")[2])
# The claim of a pod-bound service-account token that names the pod's node.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

HOST_DRIVER_ROOT = "/run/nvidia/driver"
CONTAINER_DRIVER_ROOT = "/driver-root"
HOST_RUN_DIR = "/run/dra-driver"
MPS_DIR = f"{HOST_RUN_DIR}/mps"
HAMI_CORE_DIR = "/var/lib/dra-driver/vgpu"
# Where the node's files from the ConfigMap appear in the agent's container.
NODE_FILES_DIR = "/etc/dra-driver"
NODE_CONFIG_KEY = "node-config.yaml"
SIMULATED_NODE_KEY = "simulated-node.yaml"

_LABELS = {"app.kubernetes.io/name": APP_NAME}
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_NAME_MAX = 63


class ManifestError(SettingsError):
    """A bad option; the message names the `dra-driver manifests` flag it came from."""


@dataclass(frozen=True, slots=True)
class ManifestOptions:
    driver_name: str = DEFAULT_DRIVER_NAME
    image: str = DEFAULT_IMAGE
    namespace: str = DEFAULT_NAMESPACE
    # "nvml", or "simulated:<profile>" for a test cluster without GPUs.
    hardware: str = DEFAULT_HARDWARE
    node_selector: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_NODE_SELECTOR))
    # 1: the new agent pod overlaps the old one (kubelet >= 1.33); 0: old goes, then new starts.
    max_surge: int = 1
    # A node config (how GPUs are offered: whole, MIG, vGPU), as YAML text for a ConfigMap.
    node_config: str | None = None
    # A simulated node description (YAML text) for `--hardware simulated:<file>`.
    simulated_node: str | None = None
    # HAMi-core's libvgpu.so on the hosts, which enforces vGPU limits; None: advisory limits.
    hami_core_library: str | None = None


def _label_part_problem(value: str) -> str | None:
    if len(value) > _LABEL_NAME_MAX:
        return f"{shown(value)} is longer than {_LABEL_NAME_MAX} characters"
    if not _LABEL_NAME.fullmatch(value):
        return (
            f"{shown(value)} must be letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_problem(key: str, value: str) -> str | None:
    """The API server's rule for a label (and so a nodeSelector entry): an optional DNS-subdomain
    prefix and a name in the key, and a value that is empty or follows the name rule."""
    prefix, slash, name = key.rpartition("/")
    if slash and (problem := dns_subdomain_problem(prefix)):
        return f"key prefix {problem}"
    if problem := _label_part_problem(name):
        return f"key {problem}"
    if value and (problem := _label_part_problem(value)):
        return f"value {problem}"
    return None


def parse_node_selector(entries: Iterable[str]) -> dict[str, str]:
    """`key=value` entries as a nodeSelector; checked here so that a typo fails at rendering time,
    not as a DaemonSet the API server refuses."""
    selector: dict[str, str] = {}
    for entry in entries:
        key, equals, value = entry.partition("=")
        if not equals:
            raise ManifestError(f"--node-selector: {shown(entry)} is not key=value")
        if problem := label_problem(key, value):
            raise ManifestError(f"--node-selector: {shown(entry)}: {problem}")
        selector[key] = value
    return selector


def _check(options: ManifestOptions) -> None:
    if problem := driver_name_problem(options.driver_name):
        raise ManifestError(f"--driver-name: {problem}")
    if problem := dns_label_problem(options.namespace):
        raise ManifestError(f"--namespace: {problem}")
    if not options.image or any(character.isspace() for character in options.image):
        raise ManifestError(f"--image: {shown(options.image)} is not an image reference")
    hardware = parse_hardware(options.hardware)  # its error already names --hardware
    if options.simulated_node is not None and hardware.kind != "simulated":
        raise ManifestError("--hardware: a simulated node file needs simulated hardware")
    if options.max_surge not in (0, 1):
        raise ManifestError(f"--max-surge: {options.max_surge} is not 0 or 1")
    if options.hami_core_library is not None and not options.hami_core_library.startswith("/"):
        raise ManifestError(
            f"--hami-core-library: {shown(options.hami_core_library)} must be an absolute path"
        )
    for key, value in options.node_selector.items():
        if problem := label_problem(key, value):
            raise ManifestError(f"--node-selector: {shown(f'{key}={value}')}: {problem}")


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(_LABELS)
    return metadata


def _namespace(options: ManifestOptions) -> dict[str, Any]:
    """Pod Security admission must let the privileged agent in, whatever the cluster's default."""
    metadata = _metadata(options.namespace)
    metadata["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def _service_account(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(SERVICE_ACCOUNT, options.namespace),
    }


def _cluster_role_name(options: ManifestOptions) -> str:
    """Named after the driver, so that two installations under different names keep their own."""
    return f"{options.driver_name}-node-agent"


def _cluster_role(options: ManifestOptions) -> dict[str, Any]:
    """Exactly what the agent calls: GET of a claim it prepares and of its Node, its slices'
    sync (list/watch, get, create, update, delete) and events (in the core group, which it posts)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _metadata(_cluster_role_name(options)),
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceslices"],
                "verbs": ["get", "list", "watch", "create", "update", "delete"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ],
    }


def _cluster_role_binding(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _metadata(_cluster_role_name(options)),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": _cluster_role_name(options),
        },
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": options.namespace}],
    }


def service_account_username(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"


def _policy_name(options: ManifestOptions) -> str:
    return f"{options.driver_name}-node-slices"


def _slice_on_the_agents_node(slice_variable: str) -> str:
    return f"has({slice_variable}.spec.nodeName) && {slice_variable}.spec.nodeName == variables.nodeName"


def _admission_policy(options: ManifestOptions) -> dict[str, Any]:
    """Only the agent's own node's slices, checked on the new object (CREATE, UPDATE) and the old
    one (UPDATE, DELETE), so that the agent can neither write a slice onto another node nor move
    or delete one that is there. A token without the node claim (not pod-bound) writes nothing.
    The match condition keeps the policy off everyone else, the scheduler and admins included."""
    node_name = (
        f'has(request.userInfo.extra) && "{NODE_NAME_EXTRA}" in request.userInfo.extra'
        f' && size(request.userInfo.extra["{NODE_NAME_EXTRA}"]) > 0'
        f' ? request.userInfo.extra["{NODE_NAME_EXTRA}"][0] : ""'
    )
    username = service_account_username(options.namespace)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(_policy_name(options)),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": ["resourceslices"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "is-the-node-agent",
                    "expression": f'request.userInfo.username == "{username}"',
                }
            ],
            "variables": [{"name": "nodeName", "expression": node_name}],
            "validations": [
                {
                    "expression": 'variables.nodeName != ""',
                    "message": "the node agent's service-account token must be bound to a pod on a node",
                    "reason": "Forbidden",
                },
                {
                    "expression": (
                        f'request.operation == "DELETE" || ({_slice_on_the_agents_node("object")})'
                    ),
                    "messageExpression": (
                        '"the node agent on " + variables.nodeName'
                        ' + " may only write ResourceSlices of its own node"'
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": (
                        f'request.operation == "CREATE" || ({_slice_on_the_agents_node("oldObject")})'
                    ),
                    "messageExpression": (
                        '"the node agent on " + variables.nodeName'
                        ' + " may only change or delete ResourceSlices of its own node"'
                    ),
                    "reason": "Forbidden",
                },
            ],
        },
    }


def _admission_policy_binding(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _metadata(_policy_name(options)),
        "spec": {"policyName": _policy_name(options), "validationActions": ["Deny"]},
    }


def _host_path(name: str, path: str, path_type: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": path_type}}


def _config_map_name(options: ManifestOptions) -> str:
    return f"{APP_NAME}-node"


def _node_files(options: ManifestOptions) -> dict[str, str]:
    files = {NODE_CONFIG_KEY: options.node_config, SIMULATED_NODE_KEY: options.simulated_node}
    return {key: text for key, text in files.items() if text is not None}


def _config_map(options: ManifestOptions) -> dict[str, Any]:
    """The node's files, which the same DaemonSet gives to every node it runs on."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(_config_map_name(options), options.namespace),
        "data": _node_files(options),
    }


def _optional_parts(
    options: ManifestOptions,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Environment, mounts and volumes of what is switched on: node files and HAMi-core."""
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if _node_files(options):
        mounts.append({"name": "node-files", "mountPath": NODE_FILES_DIR, "readOnly": True})
        volumes.append({"name": "node-files", "configMap": {"name": _config_map_name(options)}})
    if options.node_config is not None:
        env.append({"name": "DRA_DRIVER_NODE_CONFIG", "value": f"{NODE_FILES_DIR}/{NODE_CONFIG_KEY}"})
    if options.hami_core_library is not None:
        # Both at their host paths: the CDI mounts that put them into workloads name host paths.
        library = options.hami_core_library
        env.append({"name": "DRA_DRIVER_HAMI_CORE_LIBRARY", "value": library})
        env.append({"name": "DRA_DRIVER_HAMI_CORE_DIR", "value": HAMI_CORE_DIR})
        mounts.append({"name": "hami-core-library", "mountPath": library, "readOnly": True})
        mounts.append({"name": "hami-core-dir", "mountPath": HAMI_CORE_DIR})
        volumes.append(_host_path("hami-core-library", library, "File"))
        volumes.append(_host_path("hami-core-dir", HAMI_CORE_DIR, "DirectoryOrCreate"))
    return env, mounts, volumes


def _hardware_value(options: ManifestOptions) -> str:
    if options.simulated_node is not None:
        return f"simulated:{NODE_FILES_DIR}/{SIMULATED_NODE_KEY}"
    return options.hardware


def _daemon_set(options: ManifestOptions) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [
        {"name": "plugins-registry", "mountPath": "/var/lib/kubelet/plugins_registry"},
        {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins"},
        {"name": "cdi", "mountPath": "/var/run/cdi"},
        {"name": "dev", "mountPath": "/dev"},
        # The GPU operator's driver container may mount the driver after the agent has started.
        {
            "name": "driver-root",
            "mountPath": CONTAINER_DRIVER_ROOT,
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        },
        {"name": "run", "mountPath": HOST_RUN_DIR},
    ]
    volumes = [
        _host_path("plugins-registry", "/var/lib/kubelet/plugins_registry", "Directory"),
        _host_path("plugins", "/var/lib/kubelet/plugins", "DirectoryOrCreate"),
        _host_path("cdi", "/var/run/cdi", "DirectoryOrCreate"),
        _host_path("dev", "/dev", "Directory"),
        _host_path("driver-root", HOST_DRIVER_ROOT, "DirectoryOrCreate"),
        _host_path("run", HOST_RUN_DIR, "DirectoryOrCreate"),
    ]
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DRA_DRIVER_NAME", "value": options.driver_name},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "DRA_DRIVER_HARDWARE", "value": _hardware_value(options)},
        {"name": "DRA_DRIVER_ROOT", "value": CONTAINER_DRIVER_ROOT},
        {"name": "DRA_DRIVER_MPS_DIR", "value": MPS_DIR},
        {"name": "DRA_DRIVER_METRICS_ADDRESS", "value": f":{METRICS_PORT}"},
        {"name": "DRA_DRIVER_LOG_FORMAT", "value": "json"},
    ]
    optional_env, optional_mounts, optional_volumes = _optional_parts(options)
    env += optional_env
    mounts += optional_mounts
    volumes += optional_volumes
    container = {
        "name": "node-agent",
        "image": options.image,
        "args": ["node"],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"privileged": True},
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _metadata(APP_NAME, options.namespace),
        "spec": {
            "selector": {"matchLabels": dict(_LABELS)},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1 - options.max_surge, "maxSurge": options.max_surge},
            },
            "template": {
                "metadata": {"labels": dict(_LABELS)},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "nodeSelector": dict(options.node_selector),
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def render(options: ManifestOptions) -> list[dict[str, Any]]:
    """The objects in the order `kubectl apply` needs them: the namespace before what lives in it,
    permissions and the policy before the agent that uses them, and the DeviceClasses last."""
    _check(options)
    return [
        _namespace(options),
        *([_config_map(options)] if _node_files(options) else []),
        _service_account(options),
        _cluster_role(options),
        _cluster_role_binding(options),
        _admission_policy(options),
        _admission_policy_binding(options),
        _daemon_set(options),
        *device_classes(options.driver_name),
    ]


def render_yaml(options: ManifestOptions) -> str:
    """The objects as a YAML stream, headed by how it was made."""
    header = (
        f"# The DRA driver {options.driver_name}, rendered by `dra-driver manifests`; do not edit.\n"
        "# tests/api/test_manifests.py keeps deploy/dra-driver.yaml equal to the default rendering:\n"
        "#   dra-driver manifests > deploy/dra-driver.yaml\n"
    )
    # A wide line keeps each CEL expression on one line, where it reads as the CEL it is.
    return header + yaml.safe_dump_all(render(options), sort_keys=False, explicit_start=True, width=4096)
