"""Reading a YAML file an operator wrote (a node configuration, a simulated node).

One place says how such a file fails, so every file option reports an unreadable or malformed
file the same way; callers add which option and file it was.
"""

from pathlib import Path

import yaml


class YamlFileError(Exception):
    """The file cannot be read or is not YAML; the message says which, without the path."""


def read_yaml_file(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise YamlFileError(f"cannot read it: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise YamlFileError(f"not valid YAML: {error}") from error
