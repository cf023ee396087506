"""Every option checked before anything is rendered, so that a typo fails `dra-driver manifests`
with one line naming its flag instead of as an object the API server refuses or an agent that
cannot start on any node."""

import re
from collections.abc import Iterable

from dra_driver.base.bounded_yaml import YamlProblem, load_bounded_yaml
from dra_driver.base.kubernetes_versions import kubernetes_version_problem
from dra_driver.config.settings import parse_hardware
from dra_driver.devices.extended_resources import FIRST_MINOR, mig_profile_problem, minor_problem
from dra_driver.devices.node_config import NodeConfigError
from dra_driver.devices.node_config_checks import offline_problems
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.hardware.catalog import catalog_mig_profile_names
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.simulated_nodes import names_a_file, parse_node_spec, resolve_node_spec
from dra_driver.kube.k8s_names import dns_label_problem, dns_subdomain_problem, driver_name_problem, shown
from dra_driver.tools.manifests.daemon_set import agent_env
from dra_driver.tools.manifests.options import (
    DEFAULT_NODE_CONFIG,
    LOG_FORMATS,
    NAME_MAX,
    ManifestError,
    ManifestOptions,
)

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_NAME_MAX = 63
# An absolute path without a trailing slash, empty components or whitespace ("/" itself is one).
ABSOLUTE_PATH = re.compile(r"/|(/[^/\s]+)+")
# The API server's rule for a container's environment variable name.
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


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


def split_node_config_argument(argument: str) -> tuple[str, str]:
    """`--node-config FILE` is the default config; `--node-config NAME=FILE` a named one. A file
    whose name holds a '=' is given with a '/' before it (`./a=b.yaml`); otherwise the text before
    the '=' must be a config name, and a bad one is refused naming why (read as part of a path,
    it would only show up as a file that does not exist)."""
    name, equals, path = argument.partition("=")
    if not equals or "/" in name:
        return DEFAULT_NODE_CONFIG, argument
    if not path:
        raise ManifestError(f"--node-config: {shown(argument)}: NAME=FILE names no file after the '='")
    if problem := node_config_name_problem(name):
        raise ManifestError(
            f"--node-config: {shown(argument)}: config name {shown(name)}: {problem} (a file whose "
            "name holds a '=' is given with a '/', such as ./a=b.yaml)"
        )
    return name, path


def _load_yaml(flag: str, text: str) -> object:
    try:
        return load_bounded_yaml(text)
    except YamlProblem as error:
        raise ManifestError(f"{flag}: {error}") from None


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
        origin = f"node config {name!r}"
        try:
            config = parse_node_config(_load_yaml(flag, text), origin)
        except NodeConfigError as error:
            raise ManifestError(f"{flag}: {error}") from None
        # No node here: MIG profile names are checked against every model of the catalog.
        if problems := offline_problems(config):
            raise ManifestError(f"{flag}: {origin}: {problems[0]}")
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


def parse_env(entries: Iterable[str]) -> dict[str, str]:
    """`NAME=VALUE` entries as the agent's extra environment."""
    env: dict[str, str] = {}
    for entry in entries:
        name, equals, value = entry.partition("=")
        if not equals:
            raise ManifestError(f"--env: {shown(entry)} is not NAME=VALUE")
        env[name] = value
    return env


def _check_extra_env(options: ManifestOptions) -> None:
    """Names follow the API server's rule, so a typo fails at rendering time; one the
    installation sets itself would be silently shadowed."""
    taken = {entry["name"] for entry in agent_env(options, f"/run/{options.name}")}
    for name in options.extra_env:
        if not _ENV_NAME.fullmatch(name):
            raise ManifestError(
                f"--env: {shown(name)} is not an environment variable name "
                "(letters, digits, '_', '-' or '.', not starting with a digit)"
            )
        if name in taken:
            raise ManifestError(f"--env: {name} is set by the installation itself")


def _check_extended_resources(options: ManifestOptions) -> None:
    """Refused below 1.36 rather than rendered: an older API server drops extendedResourceName
    without a word, and pods asking for nvidia.com/gpu would wait forever."""
    if problem := kubernetes_version_problem(options.kubernetes_version):
        raise ManifestError(f"--kubernetes-version: {problem}")
    if options.extended_mig_profiles and not options.extended_resources:
        raise ManifestError("--extended-mig-profile: only with --extended-resources")
    if options.extended_resources and (problem := minor_problem(options.kubernetes_version)):
        raise ManifestError(
            f"--extended-resources: {problem}; pass --kubernetes-version 1.{FIRST_MINOR} or later"
        )
    known = catalog_mig_profile_names()
    for profile in options.extended_mig_profiles:
        if problem := mig_profile_problem(profile):
            raise ManifestError(f"--extended-mig-profile: {problem}")
        if profile not in known:
            raise ManifestError(
                f"--extended-mig-profile: {shown(profile)}: no GPU model of the catalog offers it"
            )


def check_options(options: ManifestOptions) -> None:
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
    if not 0 <= options.usage_interval <= 3600:
        raise ManifestError(f"--usage-interval: {options.usage_interval} is not between 0 and 3600 seconds")
    for key, value in options.node_selector.items():
        if problem := label_problem(key, value):
            raise ManifestError(f"--node-selector: {shown(f'{key}={value}')}: {problem}")
    _check_node_files(options)
    _check_extra_env(options)
    _check_extended_resources(options)
