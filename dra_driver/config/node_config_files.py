"""Reading node configs from disk: the one file of --node-config, and the directory of named
configs.

The decoding and the choice of a config are pure (`devices.node_config`, `devices.config_files`);
only the reads are here, at the edge, so that the device model imports no file I/O.
"""

from pathlib import Path

from dra_driver.base.yaml_files import YamlFileError, read_yaml_file
from dra_driver.devices.config_files import CONFIG_SUFFIX
from dra_driver.devices.node_config import NodeConfig, NodeConfigError
from dra_driver.devices.node_config_decode import parse_node_config


def load_node_config(path: Path | None) -> NodeConfig:
    if path is None:
        return NodeConfig()
    try:
        raw = read_yaml_file(path)
    except YamlFileError as error:
        raise NodeConfigError(f"node config {path}: {error}") from error
    return parse_node_config(raw, f"node config {path}")


def config_file_names(directory: Path) -> list[str]:
    """The regular files in the directory, hidden ones too (the caller decides)."""
    try:
        return [entry.name for entry in directory.iterdir() if entry.is_file()]
    except OSError:
        return []


def config_names(directory: Path) -> list[str]:
    """The configs in the directory, by name. Hidden entries are left alone: a ConfigMap volume
    keeps its real files under `..data` and friends."""
    return sorted(
        name.removesuffix(CONFIG_SUFFIX)
        for name in config_file_names(directory)
        if name.endswith(CONFIG_SUFFIX) and not name.startswith(".")
    )


def read_config_text(path: Path) -> bytes | None:
    """The file's bytes; None when there is no such file. Raises OSError for other failures."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
