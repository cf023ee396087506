"""The typed settings of `dra-driver node`, `inspect` and `cleanup`, read from the parsed
command line through the option table (`option_table.py`).

Values are checked once, at start, so a bad option stops the agent with one line that names the
flag, its variable and what was expected, instead of failing later in the middle of a claim.
"""

import argparse
import os
from pathlib import Path

import msgspec

from dra_driver.config import option_table as o
from dra_driver.config.option_table import DEFAULT_METRICS_ADDRESS
from dra_driver.config.option_values import (
    HardwareKind,
    HardwareSpec,
    MpsDaemonMode,
    SettingsError,
    parse_hardware,
)
from dra_driver.devices.config_files import DEFAULT_NODE_CONFIG_LABEL
from dra_driver.health.xid import DEFAULT_XID_POLICY, XidPolicy
from dra_driver.kube.k8s_names import dns_subdomain_problem, driver_name_problem
from dra_driver.kube.kubeconfig_choice import choose_kubeconfig
from dra_driver.observability.logs import LogFormat
from dra_driver.observability.server import ListenAddress
from dra_driver.plugin.sockets import dra_socket_name, registration_socket_path, socket_path_problem

# Where other modules have always imported them from.
__all__ = [
    "DEFAULT_METRICS_ADDRESS",
    "CleanupSettings",
    "HardwareKind",
    "HardwareSpec",
    "InventorySettings",
    "NodeSettings",
    "SettingsError",
    "cleanup_settings",
    "inventory_settings",
    "node_settings",
    "parse_hardware",
]


class NodeSettings(msgspec.Struct, frozen=True):
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
    # The same driver root as the host sees it, for the host paths of CDI specs: the container
    # runtime resolves them on the host, where the agent's view (`driver_root`) may not exist.
    # None: the agent sees it where the host does (see `host_root`).
    host_driver_root: Path | None = None
    # Per-claim MPS daemon directories (a tmpfs, mounted at the same path in the agent's pod).
    mps_dir: Path = Path("/run/dra-driver/mps")
    # HAMi-core's libvgpu.so on the host, for GPUs with vgpu.enforcement hami-core (needed there).
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
    # Where a claim's MPS control daemon runs (issue 26): a pod of its own in `namespace` from
    # `mps_daemon_image`, or a process of the agent; and how long prepare waits for it.
    mps_daemons: MpsDaemonMode = "process"
    mps_daemon_image: str | None = None
    namespace: str | None = None
    mps_start_timeout: float = 60.0
    # How often the MPS daemons of vGPU shares are checked while nothing is prepared (0: never):
    # a dead one shows in the metric and the shares' device health within this time.
    mps_probe_interval: float = 10.0

    # Where the kernel's sysfs is read from (the GPUs' PCIe roots and NUMA nodes under NVML).
    sysfs_root: Path = Path("/sys")
    # Where the kernel's procfs is read from (the NVIDIA driver's MIG capability files).
    proc_root: Path = Path("/proc")
    # GPU usage metrics: seconds between samples (0: none), kubelet's PodResources socket,
    # whether processes are attributed to pods by cgroup, and where pods' names are found.
    usage_interval: float = 0.0
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    usage_processes: bool = False
    pod_logs_dir: Path = Path("/var/log/pods")
    # Whether claim records are flushed to disk before kubelet is answered (record_store).
    flush_records: bool = False

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
    def host_root(self) -> Path:
        return self.driver_root if self.host_driver_root is None else self.host_driver_root

    @property
    def registration_socket(self) -> Path:
        return registration_socket_path(self.registrar_dir, self.driver_name, self.pod_uid)

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / dra_socket_name(self.pod_uid)


class InventorySettings(msgspec.Struct, frozen=True):
    node_name: str
    driver_name: str
    hardware: HardwareSpec
    node_config: Path | None
    # Where libnvidia-ml.so.1 is looked for first, and the sysfs NVML's GPUs are found in.
    driver_root: Path = Path("/")
    sysfs_root: Path = Path("/sys")


class CleanupSettings(msgspec.Struct, frozen=True):
    # None: every node (--all-nodes).
    node_name: str | None
    driver_name: str
    # None: the in-cluster service account.
    kubeconfig: Path | None
    # Said to the operator when the kubeconfig chosen is not the obvious one.
    kubeconfig_note: str = ""


def _verbosity(from_flags: int | None) -> int:
    if from_flags is not None:
        return from_flags
    raw = os.environ.get("DRA_DRIVER_VERBOSITY", "0")
    if not raw.isdigit():
        raise SettingsError(f"DRA_DRIVER_VERBOSITY: {raw!r} must be a non-negative integer")
    return int(raw)


def _identity(args: argparse.Namespace) -> tuple[str, str]:
    if not args.node_name:
        raise SettingsError("--node-name (NODE_NAME) is required: the name of this Kubernetes node")
    if problem := dns_subdomain_problem(args.node_name):
        raise SettingsError(f"--node-name (NODE_NAME): {problem}")
    if problem := driver_name_problem(args.driver_name):
        raise SettingsError(f"--driver-name (DRA_DRIVER_NAME): {problem}")
    return args.node_name, args.driver_name


def _node_configs(args: argparse.Namespace, single_file: Path | None) -> Path | None:
    path = o.NODE_CONFIGS.value(args)
    if path is not None and single_file is not None:
        raise SettingsError(
            "--node-configs (DRA_DRIVER_NODE_CONFIGS) and --node-config (DRA_DRIVER_NODE_CONFIG): "
            "give one or the other"
        )
    return path


def inventory_settings(args: argparse.Namespace) -> InventorySettings:
    node_name, driver_name = _identity(args)
    return InventorySettings(
        node_name=node_name,
        driver_name=driver_name,
        hardware=o.HARDWARE.value(args),
        node_config=o.NODE_CONFIG.value(args),
        driver_root=o.DRIVER_ROOT.value(args),
        sysfs_root=o.SYSFS_ROOT.value(args),
    )


def cleanup_settings(args: argparse.Namespace) -> CleanupSettings:
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
    choice = choose_kubeconfig(args.kubeconfig, os.environ, Path.home())  # KubeconfigUnusable names the flag
    return CleanupSettings(node_name, driver_name, choice.path, choice.note)


def _check_simulated_node(hardware: HardwareSpec) -> None:
    """An unknown profile or a broken node file is the command line's mistake: refused (2)
    before the agent reaches for a cluster, whose absence would be a run-time failure (1)."""
    if hardware.kind != "simulated":
        return
    from dra_driver.hardware.model import HardwareError  # noqa: PLC0415 - simulated nodes only
    from dra_driver.hardware.simulated_nodes import resolve_node_spec  # noqa: PLC0415

    try:
        resolve_node_spec(hardware.source)
    except HardwareError as error:
        raise SettingsError(f"{o.HARDWARE.label}: {error}") from error


def node_settings(args: argparse.Namespace, stderr_is_terminal: bool) -> NodeSettings:
    inventory = inventory_settings(args)
    plugins_dir = o.PLUGINS_DIR.value(args)
    log_format = o.LOG_FORMAT.value(args)
    settings = NodeSettings(
        node_name=inventory.node_name,
        driver_name=inventory.driver_name,
        hardware=inventory.hardware,
        node_config=inventory.node_config,
        registrar_dir=o.REGISTRAR_DIR.value(args),
        plugins_dir=plugins_dir,
        cdi_dir=o.CDI_DIR.value(args),
        state_dir=o.STATE_DIR.value(args) or plugins_dir / args.driver_name,
        kubeconfig=o.KUBECONFIG.value(args),
        log_format=log_format or ("console" if stderr_is_terminal else "json"),
        verbosity=_verbosity(args.verbosity),
        sync_delay=o.SYNC_DELAY.value(args),
        driver_root=inventory.driver_root,
        sysfs_root=inventory.sysfs_root,
        proc_root=o.PROC_ROOT.value(args),
        mps_dir=o.MPS_DIR.value(args),
        hami_core_library=o.HAMI_CORE_LIBRARY.value(args),
        hami_core_dir=o.HAMI_CORE_DIR.value(args),
        xid_policy=o.XID_POLICY.value(args),
        health_recovery_seconds=o.HEALTH_RECOVERY.value(args),
        dry_run=args.dry_run,
        metrics_address=o.METRICS_ADDRESS.value(args),
        pod_uid=o.POD_UID.value(args),
        node_configs=_node_configs(args, inventory.node_config),
        node_config_label=o.NODE_CONFIG_LABEL.value(args),
        host_driver_root=o.HOST_DRIVER_ROOT.value(args),
        mps_daemons=o.MPS_DAEMONS.value(args),
        mps_daemon_image=o.MPS_DAEMON_IMAGE.value(args),
        namespace=o.POD_NAMESPACE.value(args),
        mps_start_timeout=o.MPS_START_TIMEOUT.value(args),
        mps_probe_interval=o.MPS_PROBE_INTERVAL.value(args),
        usage_interval=o.USAGE_INTERVAL.value(args),
        pod_resources_socket=o.POD_RESOURCES_SOCKET.value(args),
        usage_processes=o.USAGE_PROCESSES.value(args),
        pod_logs_dir=o.POD_LOGS_DIR.value(args),
        flush_records=o.FLUSH_RECORDS.value(args),
    )
    if settings.mps_daemons == "pod":
        for option, value in (
            (o.MPS_DAEMON_IMAGE, settings.mps_daemon_image),
            (o.POD_NAMESPACE, settings.namespace),
        ):
            if not value:
                raise SettingsError(f"{option.label}: must be set with --mps-daemons pod")
    _check_simulated_node(settings.hardware)
    for flag, socket in (
        ("--registrar-dir", settings.registration_socket),
        ("--plugins-dir", settings.dra_socket),
    ):
        if problem := socket_path_problem(socket):
            raise SettingsError(f"{flag}: {problem}")
    return settings
