"""How the text of one option becomes a typed value: the validator column of the option table.

Each parser checks one value on its own and raises `OptionProblem` with what was wrong; the
table's row adds its flag and variable, so the operator's line always names where the value came
from and no parser repeats them. Checks that need two options together stay in `settings.py`.
"""

import os
import re
import stat
from pathlib import Path
from typing import Literal

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.base.yaml_files import YamlFileError, read_yaml_file
from dra_driver.claims.edits.hami_core_hooks import hami_core_library_problem
from dra_driver.config.node_config_files import config_file_names, load_node_config
from dra_driver.devices.config_files import config_file_problems
from dra_driver.devices.node_config import NodeConfigError
from dra_driver.health.xid import DEFAULT_XID_POLICY, XidPolicy, XidPolicyError, parse_xid_policy
from dra_driver.kube.k8s_names import DNS_LABEL_MAX, dns_label_problem, dns_subdomain_problem, uid_problem
from dra_driver.kube.kubeconfig import KubeconfigError, read_kubeconfig
from dra_driver.observability.logs import LogFormat
from dra_driver.observability.server import ListenAddress, parse_metrics_address

HardwareKind = Literal["nvml", "simulated"]
MpsDaemonMode = Literal["process", "pod"]


class SettingsError(OperatorFault, ValueError):
    """An invalid option; the message is the single line printed before exiting."""


class OptionProblem(OperatorFault, ValueError):
    """What is wrong with one value, one argument per line; the option table prefixes its flag."""


class HardwareSpec(msgspec.Struct, frozen=True):
    kind: HardwareKind
    # Profile name or YAML path for the simulated backend; empty for NVML.
    source: str = ""

    def __str__(self) -> str:
        return f"simulated:{self.source}" if self.kind == "simulated" else self.kind


def parse_hardware(value: str) -> HardwareSpec:
    """Also used by `demo` and `manifests`, whose --hardware means the same, hence the whole line."""
    if value == "nvml":
        return HardwareSpec("nvml")
    kind, _, source = value.partition(":")
    if kind == "simulated" and source:
        return HardwareSpec("simulated", source)
    raise SettingsError(
        f"--hardware (DRA_DRIVER_HARDWARE): {value!r} is not 'nvml' "
        "or 'simulated:<profile name or YAML path>'"
    )


def text(value: str | None) -> str | None:
    """Taken as given; what it must be is checked where it is used with other options."""
    return value


def absolute_path(value: str | None) -> Path:
    path = Path(value or "")
    if not value or not path.is_absolute():
        raise OptionProblem(f"{value!r} must be an absolute path")
    return path


def optional_absolute_path(value: str | None) -> Path | None:
    return absolute_path(value) if value else None


def existing_file(value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise OptionProblem(f"{value} is not a file")
    return path


def absolute_file(value: str | None) -> Path | None:
    return existing_file(str(absolute_path(value))) if value else None


# A HAMi-core build is a few MiB; the cap keeps a wrong path (a disk image, say) from being read
# into the agent's memory whole.
LIBRARY_MAX_BYTES = 64 << 20


def hami_core_library(value: str | None) -> Path | None:
    """Checked once, at start: a build that exports no hooks would load in every container and
    enforce nothing, so it is refused as invalid configuration (`hami_core_hooks.py`)."""
    path = absolute_file(value)
    if path is not None and (problem := hami_core_library_problem(_read_library(path))):
        raise OptionProblem(f"{path}: {problem}")
    return path


def _read_library(path: Path) -> bytes:
    """Non-blocking, so that a FIFO put where the file was checked cannot hang the start; it is
    then refused for not being a regular file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            regular = stat.S_ISREG(os.fstat(descriptor).st_mode)
            image = file.read(LIBRARY_MAX_BYTES + 1) if regular else b""
    except OSError as error:
        raise OptionProblem(f"{path}: cannot read it: {error.strerror}") from error
    if not regular:
        raise OptionProblem(f"{path}: is not a regular file")
    if len(image) > LIBRARY_MAX_BYTES:
        raise OptionProblem(f"{path}: is larger than {LIBRARY_MAX_BYTES >> 20} MiB, not a HAMi-core build")
    return image


def absolute_directory(value: str | None) -> Path | None:
    if not value:
        return None
    path = absolute_path(value)
    if not path.is_dir():
        raise OptionProblem(f"{value} is not a directory")
    return path


def kubeconfig_file(value: str | None) -> Path | None:
    """A kubeconfig the operator names that is absent or unusable is invalid input (exit 2), as
    in every command; only a cluster that cannot be reached is a run-time failure."""
    path = existing_file(value)
    if path is not None:
        try:
            read_kubeconfig(path)
        except KubeconfigError as error:
            raise OptionProblem(f"{path}: {error}") from error
    return path


def node_config_directory(value: str | None) -> Path | None:
    """Checked at start like validate-config checks it: a file no Node label can choose is the
    operator's mistake to fix now. The files' contents are not: a config is read when a label
    chooses it, and a malformed one offers nothing on that node alone."""
    path = absolute_directory(value)
    if path is not None and (problems := config_file_problems(config_file_names(path))):
        raise OptionProblem(*(f"{path}: {problem}" for problem in problems))
    return path


def node_config_file(value: str | None) -> Path | None:
    """Checked whole at start: a malformed file given on the command line is the operator's
    mistake to fix now, not a GPU to leave out."""
    path = existing_file(value)
    if path is not None:
        try:
            load_node_config(path)
        except NodeConfigError as error:
            raise OptionProblem(*error.problems) from error
    return path


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def label_key(value: str | None) -> str:
    """A label key as the API server takes it: an optional DNS-subdomain prefix and '/', then a
    name of at most 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric."""
    prefix, slash, name = (value or "").rpartition("/")
    problem = dns_subdomain_problem(prefix) if slash else None
    if problem is None and not (len(name) <= DNS_LABEL_MAX and _LABEL_NAME.fullmatch(name)):
        problem = f"{name!r} is not a label name (up to 63 letters, digits, '-', '_', '.')"
    if problem:
        raise OptionProblem(problem)
    return value or ""


class SecondsParser(msgspec.Struct, frozen=True):
    """A number of seconds from 0 to a bound that keeps a typo (ms for s) from a silent stall."""

    maximum: float

    def __call__(self, value: str | None) -> float:
        try:
            seconds = float(value or "")
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= self.maximum:
            raise OptionProblem(f"{value!r} must be a number of seconds from 0 to {self.maximum:g}")
        return seconds


def metrics_address(value: str | None) -> ListenAddress | None:
    """Its own error, an operator fault, already names the flag (the observability module also
    checks it)."""
    return parse_metrics_address(value or "")


def xid_policy(value: str | None) -> XidPolicy:
    if not value:
        return DEFAULT_XID_POLICY
    try:
        return parse_xid_policy(read_yaml_file(Path(value)), f"--xid-policy {value}")
    except (YamlFileError, XidPolicyError) as error:
        raise OptionProblem(str(error)) from error


def pod_uid(value: str | None) -> str | None:
    if not value:
        return None
    if problem := uid_problem(value):
        raise OptionProblem(problem)
    return value


def log_format(value: str | None) -> LogFormat | None:
    """None: chosen at start from whether stderr is a terminal."""
    if value is None:
        return None
    if value not in ("json", "console"):
        raise OptionProblem(f"{value!r} must be 'json' or 'console'")
    return "json" if value == "json" else "console"


def hardware(value: str | None) -> HardwareSpec:
    return parse_hardware(value or "")


# -- MPS control daemons (issue 26) ----------------------------------------------------------------


def mps_daemon_mode(value: str | None) -> MpsDaemonMode:
    if value == "process":
        return "process"
    if value == "pod":
        return "pod"
    raise OptionProblem(f"{value!r} must be 'process' (a process of the agent) or 'pod' (a pod per claim)")


def namespace(value: str | None) -> str | None:
    """A namespace is a DNS label; unset is checked where it is needed (--mps-daemons pod)."""
    if not value:
        return None
    if problem := dns_label_problem(value):
        raise OptionProblem(problem)
    return value


def switch(value: str | None) -> bool:
    """A yes/no option given as a value (so an environment variable can set it too)."""
    text = (value or "").strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("", "0", "false", "no"):
        return False
    raise OptionProblem(f"{value!r} must be true or false")
