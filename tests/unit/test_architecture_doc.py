"""docs/architecture.md names the files where things are decided; a file it names that is gone
(moved, renamed, split) fails here, so the page cannot silently send a newcomer to nothing."""

import re
import tomllib
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
DOC = REPOSITORY / "docs" / "architecture.md"
PACKAGE = REPOSITORY / "dra_driver"


def linked_paths(text: str) -> set[str]:
    return {target.split("#")[0] for target in re.findall(r"\]\((\.\./[^)]+)\)", text)}


def named_modules(text: str) -> set[str]:
    """Module paths written in code spans, e.g. `hardware/events.py` or `claims/engine.py`."""
    return set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*\.py)`", text))


def test_every_linked_file_exists() -> None:
    text = DOC.read_text()
    missing = [path for path in sorted(linked_paths(text)) if not (DOC.parent / path).exists()]

    assert linked_paths(text), "the page links no file"
    assert missing == []


def test_every_module_named_in_code_exists() -> None:
    missing = [
        module
        for module in sorted(named_modules(DOC.read_text()))
        if not (PACKAGE / module).exists() and not (REPOSITORY / module).exists()
    ]

    assert missing == []


def test_the_four_questions_are_answered_with_files() -> None:
    table = DOC.read_text().split("## Where things are decided", 1)[1].split("\n## ", 1)[0]
    for question in (
        "Where is a device's name decided?",
        "Where is a CDI edit decided?",
        "Where is a ResourceSlice limit decided?",
        "Where is a taint decided?",
    ):
        (row,) = [line for line in table.splitlines() if question in line]
        assert linked_paths(row), f"the answer to {question!r} names no file"


def test_a_missing_file_is_noticed() -> None:
    """Guards the checks above: a link to a file that does not exist is reported."""
    assert not (DOC.parent / "../dra_driver/devices/nowhere.py").exists()
    assert linked_paths("[x](../dra_driver/devices/nowhere.py)") == {"../dra_driver/devices/nowhere.py"}


def documented_layers(text: str) -> list[str]:
    """The layer order the page shows: each line of the text block after "## Layers" starts with
    its layer ("a" or "a | b"), then says what it holds."""
    block = text.split("## Layers", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return re.findall(r"^\S+(?: \| \S+)*", block, flags=re.MULTILINE)


def test_the_layer_order_is_the_contracts() -> None:
    config = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [contract["layers"] for contract in config["contracts"] if contract["id"] == "layers"]

    assert documented_layers(DOC.read_text()) == layers
