"""Real or simulated is decided once, in `agent/gpu_platform.py` (docs/architecture.md says
"nothing after it asks"): no module that takes a `Platform` may test for a backend's class or
read `--hardware`'s kind again. A feature that needs something different on real GPUs gets it
as a field of `Platform`, set by the one branch."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "dra_driver"
# Everything the running agent is built from, besides the branch itself and the stand-ins.
AFTER_THE_BRANCH = ("agent", "claims", "plugin", "publish", "usage", "observability", "state")
THE_BRANCH = PACKAGE / "agent" / "gpu_platform.py"
_ASKING = frozenset({"SimulatedBackend", "NvmlBackend"})


def questions(source: str) -> list[str]:
    """Where the source names a backend class or reads a `.hardware.kind`, as `line: text`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in _ASKING:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom) and any(alias.name in _ASKING for alias in node.names):
            found.append(f"{node.lineno}: import from {node.module}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "kind"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "hardware"
        ):
            found.append(f"{node.lineno}: .hardware.kind")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "from dra_driver.hardware.simulated import SimulatedBackend",
        "ok = isinstance(hardware, NvmlBackend)",
        "privileged = settings.hardware.kind == 'nvml'",
    ],
)
def test_each_way_of_asking_is_seen(source: str) -> None:
    assert questions(source)


def test_nothing_after_the_platform_asks_real_or_simulated() -> None:
    asking = {
        str(module.relative_to(PACKAGE)): found
        for package in AFTER_THE_BRANCH
        for module in sorted((PACKAGE / package).rglob("*.py"))
        if module != THE_BRANCH and (found := questions(module.read_text()))
    }

    assert asking == {}
