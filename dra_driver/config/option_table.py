"""Every option of the `dra-driver` commands, declared once: flag, environment variable (or
none), default, help and the parser that checks it.

A subcommand picks its rows from here (`add_options`), and `settings.py` reads the parsed values
through the same rows, so a flag's name, variable and error wording cannot drift apart between
the agent and the tools that must agree with it (`inspect`, `cleanup`, `validate-config`,
`manifests`). A tool that means something narrower by a flag (the node `validate-config` derives
simulated GPUs from, say) keeps the row and changes only its default and help (`Option.but`).
Flags that exist in one subcommand only are declared with it, in `dra_driver/commands/`.
"""

import argparse
import os
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import msgspec
from msgspec.structs import replace

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config import option_values as v
from dra_driver.devices.config_files import DEFAULT_NODE_CONFIG_LABEL
from dra_driver.health.xid import XidPolicy
from dra_driver.observability.server import ListenAddress

T = TypeVar("T")

# dcgm-exporter takes 9400; this port is free on a GPU node running NVIDIA's usual agents.
DEFAULT_METRICS_ADDRESS = ":9477"
# Also what `dra-driver manifests` sets up on every node unless told otherwise.
DEFAULT_HARDWARE = "nvml"
DEFAULT_DRIVER_ROOT = "/"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"


class Option(msgspec.Struct, Generic[T], frozen=True):
    flag: str
    # None: the flag alone sets it.
    env: str | None
    # The text parsed when neither the flag nor the variable is given; None: unset.
    default: str | None
    help: str
    parse: Callable[[str | None], T]
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def label(self) -> str:
        """How an error names the option: the flag, and the variable an operator may have set."""
        return f"{self.flag} ({self.env})" if self.env else self.flag

    def check(self, value: str | None) -> T:
        try:
            return self.parse(value)
        except v.OptionProblem as problem:
            raise v.SettingsError("\n".join(f"{self.label}: {line}" for line in problem.args)) from problem

    def value(self, args: argparse.Namespace) -> T:
        return self.check(getattr(args, self.dest))

    def but(self, *, default: str | None, help: str, metavar: str | None = None) -> "Option[T]":
        return replace(self, default=default, help=help, metavar=metavar or self.metavar)


def add_options(
    parser: "argparse._ActionsContainer", options: Iterable[Option[Any]], *, env: bool = True
) -> None:
    """`env=False` for the tools that never read the agent's variables (they describe another
    machine, or a cluster, not the one they run on)."""
    for option in options:
        reads_env = env and option.env is not None
        default = os.environ.get(option.env, option.default) if reads_env and option.env else option.default
        if reads_env:
            shown_default = f"; default {option.default}" if option.default else ""
            help_text = f"{option.help} [env {option.env}{shown_default}]"
        else:
            help_text = f"{option.help}; default: {option.default}" if option.default else option.help
        parser.add_argument(option.flag, default=default, metavar=option.metavar, help=help_text)


NODE_NAME = Option(
    "--node-name", "NODE_NAME", None, "name of this Kubernetes node (required); also the pool name", v.text
)
DRIVER_NAME = Option(
    "--driver-name",
    "DRA_DRIVER_NAME",
    DEFAULT_DRIVER_NAME,
    "DRA driver name published in ResourceSlices",
    v.text,
)
HARDWARE = Option(
    "--hardware",
    "DRA_DRIVER_HARDWARE",
    DEFAULT_HARDWARE,
    "'nvml', or 'simulated:<profile name or YAML path>'",
    v.hardware,
)
NODE_CONFIG = Option(
    "--node-config",
    "DRA_DRIVER_NODE_CONFIG",
    None,
    "YAML file saying how each GPU is offered: whole, MIG (static/dynamic) or vGPU",
    v.node_config_file,
)
REGISTRAR_DIR = Option(
    "--registrar-dir",
    "DRA_DRIVER_REGISTRAR_DIR",
    DEFAULT_REGISTRAR_DIR,
    "directory kubelet watches for plugin registration sockets",
    v.absolute_path,
)
PLUGINS_DIR = Option(
    "--plugins-dir",
    "DRA_DRIVER_PLUGINS_DIR",
    DEFAULT_PLUGINS_DIR,
    "kubelet plugins directory; the DRA socket goes in <plugins-dir>/<driver-name>/",
    v.absolute_path,
)
CDI_DIR = Option(
    "--cdi-dir",
    "DRA_DRIVER_CDI_DIR",
    "/var/run/cdi",
    "directory the container runtime reads CDI specs from",
    v.absolute_path,
)
STATE_DIR = Option(
    "--state-dir",
    "DRA_DRIVER_STATE_DIR",
    None,
    "durable state (default <plugins-dir>/<driver-name>)",
    v.optional_absolute_path,
)
FLUSH_RECORDS = Option(
    "--flush-records",
    "DRA_DRIVER_FLUSH_RECORDS",
    "false",
    "flush each claim record to disk before answering kubelet (a disk flush per prepare and "
    "unprepare; off, records outlive an agent crash but not a reboot, after which they are "
    "dropped anyway)",
    v.switch,
)
KUBECONFIG = Option(
    "--kubeconfig",
    "KUBECONFIG",
    None,
    "kubeconfig file (default: in-cluster service account)",
    v.kubeconfig_file,
)
LOG_FORMAT = Option(
    "--log-format",
    "DRA_DRIVER_LOG_FORMAT",
    None,
    "json or console (default: console on a terminal, else json)",
    v.log_format,
)
DRIVER_ROOT = Option(
    "--driver-root",
    "DRA_DRIVER_ROOT",
    DEFAULT_DRIVER_ROOT,
    "where the NVIDIA driver's libraries and tools are (/run/nvidia/driver with the GPU operator)",
    v.absolute_path,
)
MPS_DIR = Option(
    "--mps-dir",
    "DRA_DRIVER_MPS_DIR",
    "/run/dra-driver/mps",
    "where per-claim MPS control daemons keep their pipes and logs (a tmpfs)",
    v.absolute_path,
)
HAMI_CORE_LIBRARY = Option(
    "--hami-core-library",
    "DRA_DRIVER_HAMI_CORE_LIBRARY",
    None,
    "HAMi-core's libvgpu.so on the host, which enforces vGPU limits (unset: limits are advisory)",
    v.hami_core_library,
)
HAMI_CORE_DIR = Option(
    "--hami-core-dir",
    "DRA_DRIVER_HAMI_CORE_DIR",
    "/var/lib/dra-driver/vgpu",
    "host directory for HAMi-core's per-claim shared caches and its lock directory",
    v.absolute_path,
)
XID_POLICY: Option[XidPolicy] = Option(
    "--xid-policy",
    "DRA_DRIVER_XID_POLICY",
    None,
    "YAML file classing XIDs as ignored, informational, degraded or fatal (default: built in)",
    v.xid_policy,
)
HEALTH_RECOVERY = Option(
    "--health-recovery",
    "DRA_DRIVER_HEALTH_RECOVERY",
    "300",
    "seconds a faulty GPU must stay quiet before its taints are removed",
    v.SecondsParser(86400),
)
METRICS_ADDRESS: Option[ListenAddress | None] = Option(
    "--metrics-address",
    "DRA_DRIVER_METRICS_ADDRESS",
    DEFAULT_METRICS_ADDRESS,
    "host:port for /metrics, /healthz and /readyz; empty: not served",
    v.metrics_address,
)
POD_UID = Option(
    "--pod-uid",
    "POD_UID",
    None,
    "UID of the agent's pod (downward API); names the sockets so rolling updates can overlap",
    v.pod_uid,
)
SYSFS_ROOT = Option(
    "--sysfs-root",
    "DRA_DRIVER_SYSFS_ROOT",
    "/sys",
    "where the kernel's sysfs is mounted; NVML's GPUs are looked up under <sysfs-root>/bus/pci/devices",
    v.absolute_path,
)
PROC_ROOT = Option(
    "--proc-root",
    "DRA_DRIVER_PROC_ROOT",
    "/proc",
    "where the kernel's procfs is mounted; MIG capabilities are read under <proc-root>/driver/nvidia",
    v.absolute_path,
)
SYNC_DELAY = Option(
    "--sync-delay",
    "DRA_DRIVER_SYNC_DELAY",
    "5",
    "seconds from someone else changing or deleting our ResourceSlices to their repair",
    v.SecondsParser(3600),
)
# -- the driver root as the host sees it --
HOST_DRIVER_ROOT = Option(
    "--host-driver-root",
    "DRA_DRIVER_HOST_ROOT",
    None,
    "the --driver-root directory as the host sees it, used for host paths in CDI specs "
    "(default: the same as --driver-root)",
    v.optional_absolute_path,
)
# -- named node configs --
NODE_CONFIGS = Option(
    "--node-configs",
    "DRA_DRIVER_NODE_CONFIGS",
    None,
    "directory of named node configs <name>.yaml (a mounted ConfigMap); the node's label picks one",
    v.node_config_directory,
)
NODE_CONFIG_LABEL = Option(
    "--node-config-label",
    "DRA_DRIVER_NODE_CONFIG_LABEL",
    DEFAULT_NODE_CONFIG_LABEL,
    "Node label whose value names the node's config in --node-configs (none: default.yaml)",
    v.label_key,
)
# -- GPU usage metrics --
USAGE_INTERVAL = Option(
    "--usage-interval",
    "DRA_DRIVER_USAGE_INTERVAL",
    "10",
    "seconds between GPU usage samples (per-claim and per-pod metrics); 0: no usage metrics",
    v.SecondsParser(3600),
)
POD_RESOURCES_SOCKET = Option(
    "--pod-resources-socket",
    "DRA_DRIVER_POD_RESOURCES_SOCKET",
    "/var/lib/kubelet/pod-resources/kubelet.sock",
    "kubelet's PodResources socket, which says which pods and containers use each claim",
    v.absolute_path,
)
USAGE_PROCESSES = Option(
    "--usage-processes",
    "DRA_DRIVER_USAGE_PROCESSES",
    "false",
    "attribute GPU processes to pods by their cgroup under --proc-root (needs the host PID "
    "namespace, and --pod-logs-dir for pod names)",
    v.switch,
)
POD_LOGS_DIR = Option(
    "--pod-logs-dir",
    "DRA_DRIVER_POD_LOGS_DIR",
    "/var/log/pods",
    "kubelet's pod log directory; its <namespace>_<pod>_<uid> names map a process's pod UID to its pod",
    v.absolute_path,
)

# -- MPS control daemons: where they run (issue 26) --
MPS_DAEMONS = Option(
    "--mps-daemons",
    "DRA_DRIVER_MPS_DAEMONS",
    "process",
    "where a claim's MPS control daemon runs: 'pod' (a pod per claim, outlives the agent) or "
    "'process' (a process of the agent)",
    v.mps_daemon_mode,
)
MPS_DAEMON_IMAGE = Option(
    "--mps-daemon-image",
    "DRA_DRIVER_MPS_DAEMON_IMAGE",
    None,
    "image of the MPS daemon pods: the agent's own (needed with --mps-daemons pod)",
    v.text,
)
POD_NAMESPACE = Option(
    "--namespace",
    "POD_NAMESPACE",
    None,
    "the agent's namespace, where its MPS daemon pods go (needed with --mps-daemons pod)",
    v.namespace,
)
MPS_START_TIMEOUT = Option(
    "--mps-start-timeout",
    "DRA_DRIVER_MPS_START_TIMEOUT",
    "60",
    "seconds prepare waits for a claim's MPS control daemon to answer before it gives up",
    v.SecondsParser(600),
)
MPS_PROBE_INTERVAL = Option(
    "--mps-probe-interval",
    "DRA_DRIVER_MPS_PROBE_INTERVAL",
    "10",
    "seconds between checks that each GPU's MPS daemon of vGPU shares answers (0: no checks)",
    v.SecondsParser(3600),
)

# `dra-driver node`, in the order its --help lists them.
AGENT_OPTIONS: tuple[Option[Any], ...] = (
    NODE_NAME,
    DRIVER_NAME,
    HARDWARE,
    NODE_CONFIG,
    REGISTRAR_DIR,
    PLUGINS_DIR,
    CDI_DIR,
    STATE_DIR,
    FLUSH_RECORDS,
    KUBECONFIG,
    LOG_FORMAT,
    DRIVER_ROOT,
    MPS_DIR,
    HAMI_CORE_LIBRARY,
    HAMI_CORE_DIR,
    XID_POLICY,
    HEALTH_RECOVERY,
    METRICS_ADDRESS,
    POD_UID,
    SYSFS_ROOT,
    PROC_ROOT,
    SYNC_DELAY,
    HOST_DRIVER_ROOT,
    NODE_CONFIGS,
    NODE_CONFIG_LABEL,
    MPS_DAEMONS,
    MPS_DAEMON_IMAGE,
    POD_NAMESPACE,
    MPS_START_TIMEOUT,
    MPS_PROBE_INTERVAL,
    USAGE_INTERVAL,
    POD_RESOURCES_SOCKET,
    USAGE_PROCESSES,
    POD_LOGS_DIR,
)

# What decides the devices a node offers; `inspect` takes exactly these.
INVENTORY_OPTIONS: tuple[Option[Any], ...] = (
    NODE_NAME,
    DRIVER_NAME,
    HARDWARE,
    NODE_CONFIG,
    DRIVER_ROOT,
    SYSFS_ROOT,
)


def add_agent_switches(parser: argparse.ArgumentParser) -> None:
    """The agent's two options that are switches rather than values, so not rows of the table."""
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
