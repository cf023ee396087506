"""Named node configs: a directory of `<name>.yaml` files (a mounted ConfigMap) and a Node label
whose value names the one that applies to the node.

Pure decisions on what was read: the caller reads the label and the file's bytes, and calls
`choose_config` again whenever either changes. A config that is named but missing or malformed
offers nothing rather than whole-GPU defaults: an operator who named a config asked for its
modes, and any other mode would hand out GPUs nobody meant to share (or to hand out whole).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dra_driver.devices.node_config import ConfigProblem, NodeConfig, NodeConfigError, parse_node_config

# The config of a node without the label.
DEFAULT_CONFIG_NAME = "default"
CONFIG_SUFFIX = ".yaml"
DEFAULT_NODE_CONFIG_LABEL = "dra-driver.dev/config"


@dataclass(frozen=True, slots=True)
class ConfigChoice:
    """The node config in force, and where it came from. `config` None: nothing is offered (the
    named config is missing or malformed; `problems` say why)."""

    origin: str
    config: NodeConfig | None
    problems: tuple[ConfigProblem, ...] = ()
    # The named config's name, for the metric that shows which one a node uses ("" for none).
    name: str = ""


def label_problem(value: str) -> str | None:
    """Label values cannot hold '/', but an annotation or a hand-edited object could try: a value
    must name a file in the directory, never a path out of it."""
    if "/" in value or value.startswith(".") or "\0" in value:
        return f"{value!r} cannot name a file in the config directory"
    return None


def config_path(directory: Path, label_value: str | None) -> Path:
    return directory / f"{label_value or DEFAULT_CONFIG_NAME}{CONFIG_SUFFIX}"


def _setting(line: str, origin: str) -> str:
    """The field path a parse problem starts with, for the metric label; "file" for a problem of
    the file as a whole (not YAML, not a mapping)."""
    start = line.removeprefix(f"{origin}: ").split(": ", 1)[0]
    return "file" if " " in start else start


def parse_config_text(text: bytes, origin: str) -> NodeConfig:
    """Raises NodeConfigError, one line per problem, each starting with `origin`."""
    try:
        raw = yaml.safe_load(text.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise NodeConfigError(f"{origin}: not valid YAML: {error}") from error
    return parse_node_config(raw, origin)


def _malformed(error: NodeConfigError, origin: str, name: str) -> ConfigChoice:
    problems = tuple(ConfigProblem(_setting(line, origin), line) for line in error.problems)
    return ConfigChoice(origin, None, problems, name)


def choose_config(
    directory: Path, label_key: str, label_value: str | None, text: bytes | None, present: Sequence[str]
) -> ConfigChoice:
    """The config the label names, from the file's bytes (None: no such file); `present` lists
    the configs there are, for the message when the named one is missing."""
    if label_value and (problem := label_problem(label_value)):
        message = f"node label {label_key}={label_value}: {problem}; nothing is offered"
        return ConfigChoice(f"label {label_key}", None, (ConfigProblem(f"label {label_key}", message),))
    name = label_value or DEFAULT_CONFIG_NAME
    path = config_path(directory, label_value)
    origin = f"node config {path}"
    if text is None and not label_value:
        return ConfigChoice(
            f"whole-GPU defaults (no label {label_key} on the node, no {path})", NodeConfig(), name=""
        )
    if text is None:
        message = (
            f"node label {label_key}={label_value} names config {label_value!r}, but there is no {path} "
            f"(configs: {', '.join(present) or 'none'}); nothing is offered until it exists"
        )
        return ConfigChoice(origin, None, (ConfigProblem(f"label {label_key}", message),), name)
    try:
        config = parse_config_text(text, origin)
    except NodeConfigError as error:
        return _malformed(error, origin, name)
    return ConfigChoice(origin, config, name=name)


def unreadable(path: Path, error: OSError, name: str) -> ConfigChoice:
    """A file that exists but cannot be read (permissions, I/O): like a malformed one."""
    origin = f"node config {path}"
    line = f"{origin}: cannot read it: {error.strerror or error}"
    return ConfigChoice(origin, None, (ConfigProblem("file", line),), name)
