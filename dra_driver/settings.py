"""Every option of `dra-driver node` in one typed place: a flag and an environment variable each.

Values are checked once, at start, so a bad option stops the agent with one line that names the
flag, its variable and what was expected, instead of failing later in the middle of a claim.
"""

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.config_files import DEFAULT_NODE_CONFIG_LABEL
from dra_driver.devices.node_config import NodeConfigError
from dra_driver.health.xid import DEFAULT_XID_POLICY, XidPolicy, XidPolicyError, parse_xid_policy
from dra_driver.k8s_names import DNS_LABEL_MAX, dns_subdomain_problem, driver_name_problem, uid_problem
from dra_driver.node_config_files import load_node_config
from dra_driver.observability import ListenAddress, MetricsAddressError, parse_metrics_address
from dra_driver.plugin.sockets import dra_socket_name, registration_socket_path, socket_path_problem
from dra_driver.yaml_files import YamlFileError, read_yaml_file

HardwareKind = Literal["nvml", "simulated"]
LogFormat = Literal["json", "console"]


# dcgm-exporter takes 9400; this port is free on a GPU node running NVIDIA's usual agents.
DEFAULT_METRICS_ADDRESS = ":9477"


class SettingsError(ValueError):
    """An invalid option; the message is the single line printed before exiting."""


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    kind: HardwareKind
    # Profile name or YAML path for the simulated backend; empty for NVML.
    source: str = ""

    def __str__(self) -> str:
        return f"simulated:{self.source}" if self.kind == "simulated" else self.kind


def parse_hardware(value: str) -> HardwareSpec:
    if value == "nvml":
        return HardwareSpec("nvml")
    kind, _, source = value.partition(":")
    if kind == "simulated" and source:
        return HardwareSpec("simulated", source)
    raise SettingsError(
        f"--hardware (DRA_DRIVER_HARDWARE): {value!r} is not 'nvml' "
        "or 'simulated:<profile name or YAML path>'"
    )


@dataclass(frozen=True, slots=True)
class NodeSettings:
    node_name: str
    driver_name: str
    hardware: HardwareSpec
    # How each GPU is offered (whole, MIG, vGPU); None = whole GPUs, MIG GPUs by their instances.
    node_config: Path | None
    registrar_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    state_dir: Path
    kubeconfig: Path | None
    log_format: LogFormat
    verbosity: int
    # Seconds between noticing a foreign change to our slices and repairing it.
    sync_delay: float = 5.0
    # Print the ResourceSlice writes instead of making them.
    dry_run: bool = False
    # Where the NVIDIA driver's user-space files are: / on a plain host, /run/nvidia/driver
    # with the GPU operator's driver container.
    driver_root: Path = Path("/")
    # Per-claim MPS daemon directories (a tmpfs, mounted at the same path in the agent's pod).
    mps_dir: Path = Path("/run/dra-driver/mps")
    # HAMi-core's libvgpu.so on the host; None: vGPU limits are advisory env only.
    hami_core_library: Path | None = None
    # Per-claim HAMi-core directories and the node-wide lock directory.
    hami_core_dir: Path = Path("/var/lib/dra-driver/vgpu")
    # Which XIDs taint a GPU, and how hard.
    xid_policy: XidPolicy = DEFAULT_XID_POLICY
    # A faulty GPU's taints go after it has been quiet this long.
    health_recovery_seconds: float = 300.0
    # Where /metrics, /healthz and /readyz are served; None: not served.
    metrics_address: ListenAddress | None = None
    # The agent pod's UID, which names its sockets so that the old and the new pod of a rolling
    # update can serve side by side; None: the fixed names (one agent per node at a time).
    pod_uid: str | None = None
    # Named node configs: a directory of <name>.yaml (a mounted ConfigMap), and the Node label
    # whose value names the one for this node. None: `node_config` (or defaults) applies.
    node_configs: Path | None = None
    node_config_label: str = DEFAULT_NODE_CONFIG_LABEL

    # Where the kernel's sysfs is read from (the GPUs' PCIe roots and NUMA nodes under NVML).
    sysfs_root: Path = Path("/sys")
    # Where the kernel's procfs is read from (the NVIDIA driver's MIG capability files).
    proc_root: Path = Path("/proc")

    @property
    def inventory(self) -> "InventorySettings":
        return InventorySettings(
            self.node_name,
            self.driver_name,
            self.hardware,
            self.node_config,
            self.driver_root,
            self.sysfs_root,
        )

    @property
    def registration_socket(self) -> Path:
        return registration_socket_path(self.registrar_dir, self.driver_name, self.pod_uid)

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / dra_socket_name(self.pod_uid)


# (flag, environment variable, default, help)
_OPTIONS: tuple[tuple[str, str, str | None, str], ...] = (
    ("--node-name", "NODE_NAME", None, "name of this Kubernetes node (required); also the pool name"),
    ("--driver-name", "DRA_DRIVER_NAME", DEFAULT_DRIVER_NAME, "DRA driver name published in ResourceSlices"),
    ("--hardware", "DRA_DRIVER_HARDWARE", "nvml", "'nvml', or 'simulated:<profile name or YAML path>'"),
    (
        "--node-config",
        "DRA_DRIVER_NODE_CONFIG",
        None,
        "YAML file saying how each GPU is offered: whole, MIG (static/dynamic) or vGPU",
    ),
    (
        "--registrar-dir",
        "DRA_DRIVER_REGISTRAR_DIR",
        "/var/lib/kubelet/plugins_registry",
        "directory kubelet watches for plugin registration sockets",
    ),
    (
        "--plugins-dir",
        "DRA_DRIVER_PLUGINS_DIR",
        "/var/lib/kubelet/plugins",
        "kubelet plugins directory; the DRA socket goes in <plugins-dir>/<driver-name>/",
    ),
    (
        "--cdi-dir",
        "DRA_DRIVER_CDI_DIR",
        "/var/run/cdi",
        "directory the container runtime reads CDI specs from",
    ),
    ("--state-dir", "DRA_DRIVER_STATE_DIR", None, "durable state (default <plugins-dir>/<driver-name>)"),
    ("--kubeconfig", "KUBECONFIG", None, "kubeconfig file (default: in-cluster service account)"),
    (
        "--log-format",
        "DRA_DRIVER_LOG_FORMAT",
        None,
        "json or console (default: console on a terminal, else json)",
    ),
    (
        "--driver-root",
        "DRA_DRIVER_ROOT",
        "/",
        "where the NVIDIA driver's libraries and tools are (/run/nvidia/driver with the GPU operator)",
    ),
    (
        "--mps-dir",
        "DRA_DRIVER_MPS_DIR",
        "/run/dra-driver/mps",
        "where per-claim MPS control daemons keep their pipes and logs (a tmpfs)",
    ),
    (
        "--hami-core-library",
        "DRA_DRIVER_HAMI_CORE_LIBRARY",
        None,
        "HAMi-core's libvgpu.so on the host, which enforces vGPU limits (unset: limits are advisory)",
    ),
    (
        "--hami-core-dir",
        "DRA_DRIVER_HAMI_CORE_DIR",
        "/var/lib/dra-driver/vgpu",
        "host directory for HAMi-core's per-claim shared caches and its lock directory",
    ),
    (
        "--xid-policy",
        "DRA_DRIVER_XID_POLICY",
        None,
        "YAML file classing XIDs as ignored, informational, degraded or fatal (default: built in)",
    ),
    (
        "--health-recovery",
        "DRA_DRIVER_HEALTH_RECOVERY",
        "300",
        "seconds a faulty GPU must stay quiet before its taints are removed",
    ),
    (
        "--metrics-address",
        "DRA_DRIVER_METRICS_ADDRESS",
        DEFAULT_METRICS_ADDRESS,
        "host:port for /metrics, /healthz and /readyz; empty: not served",
    ),
    (
        "--pod-uid",
        "POD_UID",
        None,
        "UID of the agent's pod (downward API); names the sockets so rolling updates can overlap",
    ),
    (
        "--sysfs-root",
        "DRA_DRIVER_SYSFS_ROOT",
        "/sys",
        "where the kernel's sysfs is mounted; NVML's GPUs are looked up under <sysfs-root>/bus/pci/devices",
    ),
    (
        "--proc-root",
        "DRA_DRIVER_PROC_ROOT",
        "/proc",
        "where the kernel's procfs is mounted; MIG capabilities are read under <proc-root>/driver/nvidia",
    ),
    (
        "--sync-delay",
        "DRA_DRIVER_SYNC_DELAY",
        "5",
        "seconds from someone else changing or deleting our ResourceSlices to their repair",
    ),
    # -- named node configs --
    (
        "--node-configs",
        "DRA_DRIVER_NODE_CONFIGS",
        None,
        "directory of named node configs <name>.yaml (a mounted ConfigMap); the node's label picks one",
    ),
    (
        "--node-config-label",
        "DRA_DRIVER_NODE_CONFIG_LABEL",
        DEFAULT_NODE_CONFIG_LABEL,
        "Node label whose value names the node's config in --node-configs (none: default.yaml)",
    ),
)


# What decides the devices a node offers; `inspect` takes exactly these.
INVENTORY_FLAGS = (
    "--node-name",
    "--driver-name",
    "--hardware",
    "--node-config",
    "--driver-root",
    "--sysfs-root",
)


@dataclass(frozen=True, slots=True)
class InventorySettings:
    node_name: str
    driver_name: str
    hardware: HardwareSpec
    node_config: Path | None
    # Where libnvidia-ml.so.1 is looked for first, and the sysfs NVML's GPUs are found in.
    driver_root: Path = Path("/")
    sysfs_root: Path = Path("/sys")


def add_inventory_options(parser: argparse.ArgumentParser, default_node_name: str) -> None:
    for flag, env, default, help_text in _OPTIONS:
        if flag in INVENTORY_FLAGS:
            fallback = default_node_name if flag == "--node-name" else default
            parser.add_argument(flag, default=os.environ.get(env, fallback), help=f"{help_text} [env {env}]")


# What `cleanup` needs to find this node's slices.
CLEANUP_FLAGS = ("--node-name", "--driver-name")


@dataclass(frozen=True, slots=True)
class CleanupSettings:
    # None: every node (--all-nodes).
    node_name: str | None
    driver_name: str
    # None: the in-cluster service account.
    kubeconfig: Path | None
    # Said to the operator when the kubeconfig chosen is not the obvious one.
    kubeconfig_note: str = ""


def add_cleanup_options(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig has no environment default here: KUBECONFIG is a list, read as kubectl does."""
    nodes = parser.add_mutually_exclusive_group()
    for flag, env, default, help_text in _OPTIONS:
        if flag in CLEANUP_FLAGS:
            group = nodes if flag == "--node-name" else parser
            group.add_argument(flag, default=os.environ.get(env, default), help=f"{help_text} [env {env}]")
    nodes.add_argument("--all-nodes", action="store_true", help="the driver's slices of every node")
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file; default: the first existing file of KUBECONFIG, else ~/.kube/config, "
        "else the pod's service account",
    )


def add_node_options(parser: argparse.ArgumentParser) -> None:
    for flag, env, default, help_text in _OPTIONS:
        shown_default = f"; default {default}" if default else ""
        parser.add_argument(
            flag, default=os.environ.get(env, default), help=f"{help_text} [env {env}{shown_default}]"
        )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=os.environ.get("DRA_DRIVER_DRY_RUN", "") in ("1", "true"),
        help="print the ResourceSlice writes instead of making them [env DRA_DRIVER_DRY_RUN=1]",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="count",
        default=None,
        help="more log detail; repeat for more [env DRA_DRIVER_VERBOSITY]",
    )


def _directory(flag: str, env: str, value: str) -> Path:
    path = Path(value)
    if not path.is_absolute():
        raise SettingsError(f"{flag} ({env}): {value!r} must be an absolute path")
    return path


def _kubeconfig(value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise SettingsError(f"--kubeconfig (KUBECONFIG): {value} is not a file")
    return path


def _node_config(value: str | None) -> Path | None:
    """Checked whole at start: a malformed file given on the command line is the operator's
    mistake to fix now, not a GPU to leave out."""
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise SettingsError(f"--node-config (DRA_DRIVER_NODE_CONFIG): {value} is not a file")
    try:
        load_node_config(path)
    except NodeConfigError as error:
        raise SettingsError(
            "\n".join(f"--node-config (DRA_DRIVER_NODE_CONFIG): {line}" for line in error.problems)
        ) from error
    return path


# -- named node configs ----------------------------------------------------------------------------


def _node_configs(value: str | None, single_file: Path | None) -> Path | None:
    if not value:
        return None
    path = _directory("--node-configs", "DRA_DRIVER_NODE_CONFIGS", value)
    if not path.is_dir():
        raise SettingsError(f"--node-configs (DRA_DRIVER_NODE_CONFIGS): {value} is not a directory")
    if single_file is not None:
        raise SettingsError(
            "--node-configs (DRA_DRIVER_NODE_CONFIGS) and --node-config (DRA_DRIVER_NODE_CONFIG): "
            "give one or the other"
        )
    return path


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _label_key(value: str) -> str:
    """A label key as the API server takes it: an optional DNS-subdomain prefix and '/', then a
    name of at most 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric."""
    prefix, slash, name = value.rpartition("/")
    problem = dns_subdomain_problem(prefix) if slash else None
    if problem is None and not (len(name) <= DNS_LABEL_MAX and _LABEL_NAME.fullmatch(name)):
        problem = f"{name!r} is not a label name (up to 63 letters, digits, '-', '_', '.')"
    if problem:
        raise SettingsError(f"--node-config-label (DRA_DRIVER_NODE_CONFIG_LABEL): {problem}")
    return value


def _seconds(flag: str, env: str, value: str, maximum: float = 86400) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= maximum:
        raise SettingsError(f"{flag} ({env}): {value!r} must be a number of seconds from 0 to {maximum:g}")
    return seconds


def _metrics_address(value: str | None) -> ListenAddress | None:
    try:
        return parse_metrics_address(value or "")
    except MetricsAddressError as error:
        raise SettingsError(str(error)) from error


def _sync_delay(value: str) -> float:
    return _seconds("--sync-delay", "DRA_DRIVER_SYNC_DELAY", value, maximum=3600)


def _xid_policy(value: str | None) -> XidPolicy:
    if not value:
        return DEFAULT_XID_POLICY
    try:
        return parse_xid_policy(read_yaml_file(Path(value)), f"--xid-policy {value}")
    except (YamlFileError, XidPolicyError) as error:
        raise SettingsError(f"--xid-policy (DRA_DRIVER_XID_POLICY): {error}") from error


def _hami_core_library(value: str | None) -> Path | None:
    if not value:
        return None
    path = _directory("--hami-core-library", "DRA_DRIVER_HAMI_CORE_LIBRARY", value)
    if not path.is_file():
        raise SettingsError(f"--hami-core-library (DRA_DRIVER_HAMI_CORE_LIBRARY): {value} is not a file")
    return path


def _pod_uid(value: str | None) -> str | None:
    if not value:
        return None
    if problem := uid_problem(value):
        raise SettingsError(f"--pod-uid (POD_UID): {problem}")
    return value


def _verbosity(from_flags: int | None) -> int:
    if from_flags is not None:
        return from_flags
    raw = os.environ.get("DRA_DRIVER_VERBOSITY", "0")
    if not raw.isdigit():
        raise SettingsError(f"DRA_DRIVER_VERBOSITY: {raw!r} must be a non-negative integer")
    return int(raw)


def _log_format(value: str | None, stderr_is_terminal: bool) -> LogFormat:
    if value is None:
        return "console" if stderr_is_terminal else "json"
    if value not in ("json", "console"):
        raise SettingsError(f"--log-format (DRA_DRIVER_LOG_FORMAT): {value!r} must be 'json' or 'console'")
    return "json" if value == "json" else "console"


def inventory_settings(args: argparse.Namespace) -> InventorySettings:
    node_name, driver_name = _identity(args)
    return InventorySettings(
        node_name=node_name,
        driver_name=driver_name,
        hardware=parse_hardware(args.hardware),
        node_config=_node_config(args.node_config),
        driver_root=_directory("--driver-root", "DRA_DRIVER_ROOT", args.driver_root),
        sysfs_root=_directory("--sysfs-root", "DRA_DRIVER_SYSFS_ROOT", args.sysfs_root),
    )


def _identity(args: argparse.Namespace) -> tuple[str, str]:
    if not args.node_name:
        raise SettingsError("--node-name (NODE_NAME) is required: the name of this Kubernetes node")
    if problem := dns_subdomain_problem(args.node_name):
        raise SettingsError(f"--node-name (NODE_NAME): {problem}")
    if problem := driver_name_problem(args.driver_name):
        raise SettingsError(f"--driver-name (DRA_DRIVER_NAME): {problem}")
    return args.node_name, args.driver_name


def cleanup_settings(args: argparse.Namespace) -> CleanupSettings:
    from dra_driver.kubeconfig_choice import choose_kubeconfig  # noqa: PLC0415 - it imports this module

    if not args.all_nodes and not args.node_name:
        raise SettingsError(
            "--node-name (NODE_NAME) or --all-nodes is required: which node's slices to delete"
        )
    if args.all_nodes:
        node_name = None
        if problem := driver_name_problem(args.driver_name):
            raise SettingsError(f"--driver-name (DRA_DRIVER_NAME): {problem}")
        driver_name = args.driver_name
    else:
        node_name, driver_name = _identity(args)
    choice = choose_kubeconfig(args.kubeconfig, os.environ, Path.home())
    return CleanupSettings(node_name, driver_name, choice.path, choice.note)


def node_settings(args: argparse.Namespace, stderr_is_terminal: bool) -> NodeSettings:
    inventory = inventory_settings(args)
    plugins_dir = _directory("--plugins-dir", "DRA_DRIVER_PLUGINS_DIR", args.plugins_dir)
    settings = NodeSettings(
        node_name=inventory.node_name,
        driver_name=inventory.driver_name,
        hardware=inventory.hardware,
        node_config=inventory.node_config,
        registrar_dir=_directory("--registrar-dir", "DRA_DRIVER_REGISTRAR_DIR", args.registrar_dir),
        plugins_dir=plugins_dir,
        cdi_dir=_directory("--cdi-dir", "DRA_DRIVER_CDI_DIR", args.cdi_dir),
        state_dir=(
            _directory("--state-dir", "DRA_DRIVER_STATE_DIR", args.state_dir)
            if args.state_dir
            else plugins_dir / args.driver_name
        ),
        kubeconfig=_kubeconfig(args.kubeconfig),
        log_format=_log_format(args.log_format, stderr_is_terminal),
        verbosity=_verbosity(args.verbosity),
        sync_delay=_sync_delay(args.sync_delay),
        driver_root=inventory.driver_root,
        sysfs_root=inventory.sysfs_root,
        proc_root=_directory("--proc-root", "DRA_DRIVER_PROC_ROOT", args.proc_root),
        mps_dir=_directory("--mps-dir", "DRA_DRIVER_MPS_DIR", args.mps_dir),
        hami_core_library=_hami_core_library(args.hami_core_library),
        hami_core_dir=_directory("--hami-core-dir", "DRA_DRIVER_HAMI_CORE_DIR", args.hami_core_dir),
        xid_policy=_xid_policy(args.xid_policy),
        health_recovery_seconds=_seconds(
            "--health-recovery", "DRA_DRIVER_HEALTH_RECOVERY", args.health_recovery
        ),
        dry_run=args.dry_run,
        metrics_address=_metrics_address(args.metrics_address),
        pod_uid=_pod_uid(args.pod_uid),
        node_configs=_node_configs(args.node_configs, inventory.node_config),
        node_config_label=_label_key(args.node_config_label),
    )
    for flag, socket in (
        ("--registrar-dir", settings.registration_socket),
        ("--plugins-dir", settings.dra_socket),
    ):
        if problem := socket_path_problem(socket):
            raise SettingsError(f"{flag}: {problem}")
    return settings
