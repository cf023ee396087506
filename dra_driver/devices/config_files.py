"""Named node configs: a directory of `<name>.yaml` files (a mounted ConfigMap) and a Node label
whose value names the one that applies to the node.

Pure decisions on what was read: the caller reads the label and the file's bytes, and calls
`choose_config` again whenever either changes. A config that is named but missing or malformed
offers nothing rather than whole-GPU defaults: an operator who named a config asked for its
modes, and any other mode would hand out GPUs nobody meant to share (or to hand out whole).
"""

from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from dra_driver.base.bounded_yaml import YamlProblem, load_bounded_yaml
from dra_driver.base.strict_decode import quoted
from dra_driver.devices.node_config import ConfigProblem, NodeConfig, NodeConfigError
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.kube.k8s_names import label_value_problem

# The config of a node without the label.
DEFAULT_CONFIG_NAME = "default"
CONFIG_SUFFIX = ".yaml"
DEFAULT_NODE_CONFIG_LABEL = "dra-driver.dev/config"


class ConfigChoice(msgspec.Struct, frozen=True):
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
        return f"{quoted(value)} cannot name a file in the config directory"
    return None


def config_file_problems(file_names: Iterable[str]) -> list[str]:
    """Files of a config directory that no Node label can choose: the name before `.yaml` goes
    into a label value, so it must be one; and a `.yml` (or differently cased) file would never
    be read, so it is refused rather than skipped without a word. Hidden entries are the
    ConfigMap volume's own (`..data`) and are left alone."""
    problems = []
    for file_name in sorted(file_names):
        stem, dot, suffix = file_name.rpartition(".")
        if file_name.startswith(".") or not dot:
            continue
        if suffix.lower() in ("yml", "yaml") and suffix != "yaml":
            problems.append(
                f"{quoted(file_name)}: configs are read from <name>{CONFIG_SUFFIX} files only; "
                f"rename it {quoted(stem + CONFIG_SUFFIX)}"
            )
        elif suffix == "yaml" and (problem := label_value_problem(stem)):
            problems.append(
                f"{quoted(file_name)}: config name {problem}, as the node label that chooses it must be"
            )
    return problems


def config_path(directory: Path, label_value: str | None) -> Path:
    return directory / f"{label_value or DEFAULT_CONFIG_NAME}{CONFIG_SUFFIX}"


def _setting(line: str, origin: str) -> str:
    """The field path a parse problem starts with, for the metric label; "file" for a problem of
    the file as a whole (not YAML, not a mapping)."""
    start = line.removeprefix(f"{origin}: ").split(": ", 1)[0]
    return "file" if " " in start else start


def parse_config_text(text: bytes, origin: str) -> NodeConfig:
    """Raises NodeConfigError, one line per problem, each starting with `origin`; a file past the
    bounds of `base.bounded_yaml` is refused before it is decoded."""
    try:
        raw = load_bounded_yaml(text)
    except YamlProblem as error:
        raise NodeConfigError(f"{origin}: {error}") from error
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
            f"node label {label_key}={label_value} names config {quoted(label_value)}, "
            f"but there is no {path} "
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
