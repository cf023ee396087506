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
- deploy/helm/dra-driver renders the same objects from values (tests/api/test_helm_chart.py
  installs it with real Helm and compares), plus Helm's own labels.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME, __version__
from dra_driver.devices.classes import APP_NAME, device_classes
from dra_driver.devices.node_config import NodeConfigError, parse_node_config
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.simulated_nodes import names_a_file, parse_node_spec, resolve_node_spec
from dra_driver.k8s_names import dns_label_problem, dns_subdomain_problem, driver_name_problem, shown
from dra_driver.settings import DEFAULT_METRICS_ADDRESS, SettingsError, parse_hardware

# What the documented build tags (the Dockerfile's header: `docker build -t dra-driver:<version> .`);
# nothing publishes an image, so the default names the one a user builds, and the operator points
# --image (image.repository in the chart) at the registry the nodes pull from.
DEFAULT_IMAGE = f"dra-driver:{__version__}"
DEFAULT_NAME = APP_NAME
DEFAULT_NAMESPACE = "dra-driver"
DEFAULT_HARDWARE = "nvml"
DEFAULT_DRIVER_ROOT = "/"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
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

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
# The API server's rule for a container's environment variable name.
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_LABEL_NAME_MAX = 63
# An absolute path without a trailing slash, empty components or whitespace ("/" itself is one).
ABSOLUTE_PATH = re.compile(r"/|(/[^/\s]+)+")


class ManifestError(SettingsError):
    """A bad option; the message names the `dra-driver manifests` flag it came from."""


@dataclass(frozen=True, slots=True)
class ManifestOptions:
    # The installation's name (a Helm release's name): names the namespaced objects and pods.
    name: str = DEFAULT_NAME
    driver_name: str = DEFAULT_DRIVER_NAME
    image: str = DEFAULT_IMAGE
    namespace: str = DEFAULT_NAMESPACE
    # "nvml", or "simulated:<profile>" for a test cluster without GPUs.
    hardware: str = DEFAULT_HARDWARE
    # Empty: the agent runs on GPU nodes (GPU_NODE_LABELS, as node affinity); else only there.
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # 1: the new agent pod overlaps the old one (kubelet >= 1.33); 0: old goes, then new starts.
    max_surge: int = 1
    # Named node configs (how GPUs are offered: whole, MIG, vGPU) as YAML text, by config name.
    node_configs: Mapping[str, str] = field(default_factory=dict)
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
    extra_env: Mapping[str, str] = field(default_factory=dict)


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


def node_config_name_problem(name: str) -> str | None:
    """A config is named by a Node label's value and stored as the key `<name>.yaml`."""
    return _label_part_problem(name)


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


def parse_env(entries: Iterable[str]) -> dict[str, str]:
    """`NAME=VALUE` entries as the agent's extra environment; the name follows the API server's
    rule, so that a typo fails at rendering time."""
    env: dict[str, str] = {}
    for entry in entries:
        name, equals, value = entry.partition("=")
        if not equals:
            raise ManifestError(f"--env: {shown(entry)} is not NAME=VALUE")
        env[name] = value
    return env


def _check_extra_env(options: ManifestOptions) -> None:
    taken = {entry["name"] for entry in _agent_env(options, f"/run/{options.name}")}
    for name in options.extra_env:
        if not _ENV_NAME.fullmatch(name):
            raise ManifestError(
                f"--env: {shown(name)} is not an environment variable name "
                "(letters, digits, '_', '-' or '.', not starting with a digit)"
            )
        if name in taken:
            raise ManifestError(f"--env: {name} is set by the installation itself")


def split_node_config_argument(argument: str) -> tuple[str, str]:
    """`--node-config FILE` is the default config; `--node-config NAME=FILE` a named one. Text
    before a '=' that is not a config name is part of a file name."""
    name, equals, path = argument.partition("=")
    if equals and path and node_config_name_problem(name) is None:
        return name, path
    return DEFAULT_NODE_CONFIG, argument


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message on one line, with its line and column (1-based)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())


def _load_yaml(flag: str, text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ManifestError(f"{flag}: not valid YAML: {_yaml_problem(error)}") from None


def _check_path(flag: str, value: str) -> None:
    if not ABSOLUTE_PATH.fullmatch(value):
        raise ManifestError(
            f"{flag}: {shown(value)} must be an absolute path without a trailing '/' or spaces"
        )


def _check_node_files(options: ManifestOptions) -> None:
    """Each node config and the simulated node parsed as the agent will parse them."""
    for name, text in options.node_configs.items():
        flag = f"--node-config {name}"
        if problem := node_config_name_problem(name):
            raise ManifestError(f"--node-config: config name {problem}")
        try:
            parse_node_config(_load_yaml(flag, text), f"node config {name!r}")
        except NodeConfigError as error:
            raise ManifestError(f"{flag}: {error}") from None
    hardware = parse_hardware(options.hardware)  # its error already names --hardware
    if options.simulated_node is not None:
        if hardware.kind != "simulated":
            raise ManifestError("--hardware: a simulated node file needs simulated hardware")
        try:
            raw = _load_yaml(f"--hardware: simulated node file {hardware.source}", options.simulated_node)
            parse_node_spec(raw, f"file {hardware.source}")
        except HardwareError as error:
            raise ManifestError(f"--hardware: {error}") from None
    elif hardware.kind == "simulated":
        if names_a_file(hardware.source):
            raise ManifestError(f"--hardware: the simulated node file {hardware.source} was not read")
        try:
            resolve_node_spec(hardware.source)
        except HardwareError as error:
            raise ManifestError(f"--hardware: {error}") from None


def _check(options: ManifestOptions) -> None:
    if problem := dns_label_problem(options.name):
        raise ManifestError(f"--name: {problem}")
    if len(options.name) > NAME_MAX:
        raise ManifestError(f"--name: {shown(options.name)} is longer than {NAME_MAX} characters")
    if problem := driver_name_problem(options.driver_name):
        raise ManifestError(f"--driver-name: {problem}")
    if problem := dns_label_problem(options.namespace):
        raise ManifestError(f"--namespace: {problem}")
    if not options.image or any(character.isspace() for character in options.image):
        raise ManifestError(f"--image: {shown(options.image)} is not an image reference")
    if options.max_surge not in (0, 1):
        raise ManifestError(f"--max-surge: {options.max_surge} is not 0 or 1")
    if options.hami_core_library is not None:
        _check_path("--hami-core-library", options.hami_core_library)
    for flag, path in (
        ("--driver-root", options.driver_root),
        ("--registrar-dir", options.registrar_dir),
        ("--plugins-dir", options.plugins_dir),
    ):
        _check_path(flag, path)
    if options.priority_class_name and (problem := dns_subdomain_problem(options.priority_class_name)):
        raise ManifestError(f"--priority-class-name: {problem}")
    if not 0 <= options.log_verbosity <= 10:
        raise ManifestError(f"--log-verbosity: {options.log_verbosity} is not between 0 and 10")
    if options.log_format not in LOG_FORMATS:
        raise ManifestError(f"--log-format: {shown(options.log_format)} is not 'json' or 'console'")
    if not 1 <= options.metrics_port <= 65535:
        raise ManifestError(f"--metrics-port: {options.metrics_port} is not a port (1-65535)")
    for key, value in options.node_selector.items():
        if problem := label_problem(key, value):
            raise ManifestError(f"--node-selector: {shown(f'{key}={value}')}: {problem}")
    _check_node_files(options)
    _check_extra_env(options)


def selector_labels(options: ManifestOptions) -> dict[str, str]:
    """What the DaemonSet selects its pods by: the app and the installation."""
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": options.name}


def _labels(options: ManifestOptions) -> dict[str, str]:
    return {**selector_labels(options), "app.kubernetes.io/version": __version__}


def _metadata(options: ManifestOptions, name: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = _labels(options)
    return metadata


def _namespace(options: ManifestOptions) -> dict[str, Any]:
    """Pod Security admission must let the privileged agent in, whatever the cluster's default."""
    metadata = _metadata(options, options.namespace)
    metadata["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def service_account_name(options: ManifestOptions) -> str:
    return options.name


def _service_account(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(options, service_account_name(options), options.namespace),
    }


def _cluster_role_name(options: ManifestOptions) -> str:
    """Named after the driver, so that two installations under different names keep their own."""
    return f"{options.driver_name}-node-agent"


def _cluster_role(options: ManifestOptions) -> dict[str, Any]:
    """Exactly what the agent calls: GET of a claim it prepares, its own Node (read and watched
    for the label that names its node config), its slices' sync (list/watch, get, create, update,
    delete) and events (in the core group, which it posts and, repeated, patches)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _metadata(options, _cluster_role_name(options)),
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceslices"],
                "verbs": ["get", "list", "watch", "create", "update", "delete"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    }


def _cluster_role_binding(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _metadata(options, _cluster_role_name(options)),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": _cluster_role_name(options),
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": service_account_name(options),
                "namespace": options.namespace,
            }
        ],
    }


def service_account_username(namespace: str, name: str = DEFAULT_NAME) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


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
    username = service_account_username(options.namespace, service_account_name(options))
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(options, _policy_name(options)),
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
        "metadata": _metadata(options, _policy_name(options)),
        "spec": {"policyName": _policy_name(options), "validationActions": ["Deny"]},
    }


def _host_path(name: str, path: str, path_type: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": path_type}}


def _config_maps(options: ManifestOptions) -> list[dict[str, Any]]:
    """The node configs and the simulated node, which the same DaemonSet gives to every node."""
    maps = []
    if options.node_configs:
        data = {f"{name}.yaml": text for name, text in sorted(options.node_configs.items())}
        maps.append((f"{options.name}-node-configs", data))
    if options.simulated_node is not None:
        maps.append((f"{options.name}-simulated-node", {SIMULATED_NODE_KEY: options.simulated_node}))
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(options, name, options.namespace),
            "data": data,
        }
        for name, data in maps
    ]


def _optional_parts(
    options: ManifestOptions,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Environment, mounts and volumes of what is switched on: node files and HAMi-core."""
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if options.node_configs:
        env.append({"name": "DRA_DRIVER_NODE_CONFIGS", "value": NODE_CONFIGS_DIR})
        mounts.append({"name": "node-configs", "mountPath": NODE_CONFIGS_DIR, "readOnly": True})
        volumes.append({"name": "node-configs", "configMap": {"name": f"{options.name}-node-configs"}})
    if options.simulated_node is not None:
        mounts.append({"name": "simulated-node", "mountPath": SIMULATED_NODE_DIR, "readOnly": True})
        volumes.append({"name": "simulated-node", "configMap": {"name": f"{options.name}-simulated-node"}})
    if options.hami_core_library is not None:
        # Both at their host paths: the CDI mounts that put them into workloads name host paths.
        library = options.hami_core_library
        hami_core_dir = f"/var/lib/{options.name}/vgpu"
        env.append({"name": "DRA_DRIVER_HAMI_CORE_LIBRARY", "value": library})
        env.append({"name": "DRA_DRIVER_HAMI_CORE_DIR", "value": hami_core_dir})
        mounts.append({"name": "hami-core-library", "mountPath": library, "readOnly": True})
        mounts.append({"name": "hami-core-dir", "mountPath": hami_core_dir})
        volumes.append(_host_path("hami-core-library", library, "File"))
        volumes.append(_host_path("hami-core-dir", hami_core_dir, "DirectoryOrCreate"))
    return env, mounts, volumes


def _hardware_value(options: ManifestOptions) -> str:
    if options.simulated_node is not None:
        return f"simulated:{SIMULATED_NODE_DIR}/{SIMULATED_NODE_KEY}"
    return options.hardware


def _placement(options: ManifestOptions) -> dict[str, Any]:
    """A node selector when one is given; else the GPU nodes, found by either label (ORed terms)."""
    if options.node_selector:
        return {"nodeSelector": dict(options.node_selector)}
    terms = [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        for key, value in GPU_NODE_LABELS
    ]
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    }


def _agent_env(options: ManifestOptions, run_dir: str) -> list[dict[str, Any]]:
    """The agent container's own environment. It reads the driver root at CONTAINER_DRIVER_ROOT
    and names it in CDI specs as the host has it: the container runtime resolves them on the host."""
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DRA_DRIVER_NAME", "value": options.driver_name},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "DRA_DRIVER_HARDWARE", "value": _hardware_value(options)},
        {"name": "DRA_DRIVER_ROOT", "value": CONTAINER_DRIVER_ROOT},
        {"name": "DRA_DRIVER_HOST_ROOT", "value": options.driver_root},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "DRA_DRIVER_REGISTRAR_DIR", "value": options.registrar_dir},
        {"name": "DRA_DRIVER_PLUGINS_DIR", "value": options.plugins_dir},
        {"name": "DRA_DRIVER_MPS_DIR", "value": f"{run_dir}/mps"},
        {"name": "DRA_DRIVER_METRICS_ADDRESS", "value": f":{options.metrics_port}"},
        {"name": "DRA_DRIVER_LOG_FORMAT", "value": options.log_format},
        {"name": "DRA_DRIVER_VERBOSITY", "value": str(options.log_verbosity)},
    ]
    return env + _optional_parts(options)[0]


def _daemon_set(options: ManifestOptions) -> dict[str, Any]:
    run_dir = f"/run/{options.name}"
    mounts: list[dict[str, Any]] = [
        {"name": "plugins-registry", "mountPath": options.registrar_dir},
        {"name": "plugins", "mountPath": options.plugins_dir},
        {"name": "cdi", "mountPath": "/var/run/cdi"},
        {"name": "dev", "mountPath": "/dev"},
        # The GPU operator's driver container may mount the driver after the agent has started.
        {
            "name": "driver-root",
            "mountPath": CONTAINER_DRIVER_ROOT,
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        },
        {"name": "run", "mountPath": run_dir},
    ]
    volumes = [
        _host_path("plugins-registry", options.registrar_dir, "Directory"),
        _host_path("plugins", options.plugins_dir, "DirectoryOrCreate"),
        _host_path("cdi", "/var/run/cdi", "DirectoryOrCreate"),
        _host_path("dev", "/dev", "Directory"),
        _host_path("driver-root", options.driver_root, "DirectoryOrCreate"),
        _host_path("run", run_dir, "DirectoryOrCreate"),
    ]
    env = _agent_env(options, run_dir)
    _, optional_mounts, optional_volumes = _optional_parts(options)
    env += [{"name": name, "value": value} for name, value in options.extra_env.items()]
    mounts += optional_mounts
    volumes += optional_volumes
    container = {
        "name": "node-agent",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["node"],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": options.metrics_port, "protocol": "TCP"}],
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
    pod: dict[str, Any] = {"serviceAccountName": service_account_name(options)}
    if options.priority_class_name:
        pod["priorityClassName"] = options.priority_class_name
    pod.update(_placement(options))
    pod["tolerations"] = [dict(toleration) for toleration in DEFAULT_TOLERATIONS]
    pod["containers"] = [container]
    pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _metadata(options, options.name, options.namespace),
        "spec": {
            "selector": {"matchLabels": selector_labels(options)},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": options.max_surge, "maxUnavailable": 1 - options.max_surge},
            },
            "template": {"metadata": {"labels": selector_labels(options)}, "spec": pod},
        },
    }


def _device_classes(options: ManifestOptions) -> list[dict[str, Any]]:
    classes = device_classes(options.driver_name)
    for device_class in classes:
        device_class["metadata"]["labels"] = _labels(options)
    return classes


def render(options: ManifestOptions) -> list[dict[str, Any]]:
    """The objects in the order `kubectl apply` needs them: the namespace before what lives in it,
    permissions and the policy before the agent that uses them, and the DeviceClasses last."""
    _check(options)
    return [
        _namespace(options),
        *_config_maps(options),
        _service_account(options),
        _cluster_role(options),
        _cluster_role_binding(options),
        _admission_policy(options),
        _admission_policy_binding(options),
        _daemon_set(options),
        *_device_classes(options),
    ]


def render_yaml(options: ManifestOptions) -> str:
    """The objects as a YAML stream, headed by how it was made."""
    header = (
        f"# The DRA driver {options.driver_name}, rendered by `dra-driver manifests`; do not edit.\n"
        "# tests/api/test_manifests.py keeps deploy/dra-driver.yaml equal to the default rendering:\n"
        "#   dra-driver manifests > deploy/dra-driver.yaml\n"
        "# The Helm chart deploy/helm/dra-driver installs the same objects from values.\n"
    )
    # A wide line keeps each CEL expression on one line, where it reads as the CEL it is.
    return header + yaml.safe_dump_all(render(options), sort_keys=False, explicit_start=True, width=4096)


def chart_values(options: ManifestOptions) -> dict[str, Any]:
    """The values of deploy/helm/dra-driver that install what `render(options)` renders (less the
    Namespace, which the chart leaves to `--create-namespace` or the operator), as the release
    `options.name` in the namespace `options.namespace`. tests/api/test_helm_chart.py proves the
    two agree; the e2e setup installs the chart with them."""
    _check(options)
    repository, _, tag = options.image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = options.image, "latest"
    values: dict[str, Any] = {
        "driverName": options.driver_name,
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "hardware": options.hardware if options.simulated_node is None else DEFAULT_HARDWARE,
        "driverRoot": options.driver_root,
        "kubeletRegistrarDir": options.registrar_dir,
        "kubeletPluginsDir": options.plugins_dir,
        "priorityClassName": options.priority_class_name,
        "updateStrategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": options.max_surge, "maxUnavailable": 1 - options.max_surge},
        },
        "logVerbosity": options.log_verbosity,
        "logFormat": options.log_format,
        "nodeConfigs": {name: yaml.safe_load(text) or {} for name, text in options.node_configs.items()},
        "hamiCore": {"library": options.hami_core_library or ""},
        "metrics": {"port": options.metrics_port},
        "extraEnv": [{"name": name, "value": value} for name, value in options.extra_env.items()],
    }
    if options.simulated_node is not None:
        values["simulatedNode"] = yaml.safe_load(options.simulated_node)
    if options.node_selector:
        values["nodeSelector"] = dict(options.node_selector)
        values["affinity"] = None  # Helm merges maps into the defaults; null removes one
    return values
