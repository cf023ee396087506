"""Reading a YAML file an operator wrote (a node configuration, a simulated node, a kubeconfig).

One place says how such a file fails, so every file option reports an unreadable, oversized or
malformed file the same way; callers add which option and file it was.
"""

from pathlib import Path

from dra_driver.base.bounded_yaml import MAX_BYTES, YamlProblem, load_bounded_yaml
from dra_driver.base.errors import OperatorFault


class YamlFileError(OperatorFault):
    """The file cannot be read or is not YAML; the message says which, without the path."""


def read_yaml_file(path: Path) -> object:
    """Reads one byte past the bound at most, so a huge file (or /dev/zero) is refused unread."""
    try:
        with path.open("rb") as file:
            text = file.read(MAX_BYTES + 1)
    except OSError as error:
        raise YamlFileError(f"cannot read it: {error.strerror}") from error
    try:
        return load_bounded_yaml(text)
    except YamlProblem as error:
        raise YamlFileError(str(error)) from error
