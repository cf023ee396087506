"""The mode registry is the one list of modes: every mode states every part of the contract, and
the chart schema, `plan --mode`, the configuration docs and the code all name the same modes,
with no list or per-mode branch of mode names left outside devices/modes."""

import argparse
import ast
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from dra_driver.cli import build_parser
from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.inventory import build_inventory
from dra_driver.devices.model import DeviceType
from dra_driver.devices.modes.contract import DeviceMode, PlanAsks
from dra_driver.devices.modes.registry import (
    AUTO,
    CONFIG_MODES,
    MODE_NAMES,
    MODES,
    auto_mode,
    find_mode,
    layout_kind_of,
    layout_kinds,
    mode_named,
)
from dra_driver.devices.node_config import GpuEntry, NodeConfig, plan_node
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.publish.capabilities import ApiFeature
from tests.support.nodes import GIB, simulated_node

REPOSITORY = Path(__file__).resolve().parents[3]
MODES_PACKAGE = REPOSITORY / "dra_driver" / "devices" / "modes"
SCHEMA = REPOSITORY / "deploy" / "helm" / "dra-driver" / "values.schema.json"
CONFIGURATION_DOC = REPOSITORY / "docs" / "configuration.md"
# Owned by another change (the agent's node loop): it picks the vGPU plans by the "vgpu-" prefix.
PREFIX_CHECKS_ALLOWED: set[str] = set()


def test_the_registry_lists_every_mode_module_once() -> None:
    """A module written but not registered would be a mode nobody can configure."""
    modules = {path.stem for path in MODES_PACKAGE.glob("*.py")} - {"__init__", "contract", "registry"}
    assert sorted(name.replace("-", "_") for name in MODE_NAMES) == sorted(modules)
    for mode in MODES:
        module = importlib.import_module(f"dra_driver.devices.modes.{mode.name.replace('-', '_')}")
        assert module.MODE is mode
        assert mode.name == module.NAME
    assert len(set(MODE_NAMES)) == len(MODE_NAMES)
    assert (AUTO, *MODE_NAMES) == CONFIG_MODES
    assert AUTO not in MODE_NAMES


@pytest.mark.parametrize("mode", MODES, ids=MODE_NAMES)
def test_every_mode_provides_every_part(mode: DeviceMode) -> None:
    for field in DeviceMode.__struct_fields__:
        value = getattr(mode, field)
        assert value is not None or field == "fallback", field
        if field in ("name", "description", "not_planned", "layout_kind"):
            assert isinstance(value, str)
            assert value.strip(), field
            assert "\n" not in value, field
        if field in ("fits", "offers", "entered", "planned", "serves", "shown_by"):
            assert callable(value), field
    assert mode.description.endswith(")")  # says the MIG state the GPU needs
    assert ("MIG on" in mode.description) == mode.in_mig_mode
    assert mode.blocks <= {"vgpu", "mig"}
    assert not mode.partitions or "vgpu" in mode.blocks
    assert mode.layout_kind in layout_kinds()
    assert find_mode(mode.name) is mode
    assert mode_named(mode.name) is mode


def test_mode_auto_has_exactly_one_mode_per_mig_state() -> None:
    for in_mig_mode in (True, False):
        assert len([mode for mode in MODES if mode.auto and mode.in_mig_mode == in_mig_mode]) == 1


def test_each_fallback_is_a_registered_mode_behind_a_known_gate_and_the_chains_end() -> None:
    for mode in MODES:
        seen = {mode.name}
        step = mode.fallback
        while step is not None:
            assert step.gate in get_args(ApiFeature)
            assert step.mode not in seen, f"{mode.name} falls back in a circle"
            seen.add(step.mode)
            step = mode_named(step.mode).fallback


def test_an_unknown_name_is_refused_naming_the_modes() -> None:
    assert find_mode("warp") is None
    with pytest.raises(LookupError, match="gpu, mig-static"):
        mode_named("warp")


def _sample_gpu(mode: DeviceMode) -> Gpu:
    """A GPU of the `mixed` profile in the mode's MIG state (a MIG one with instances)."""
    gpus = simulated_node("mixed")
    if mode.in_mig_mode:
        return next(g for g in gpus if g.mig_mode is MigMode.ENABLED and g.mig_instances)
    return next(g for g in gpus if g.mig_mode is MigMode.DISABLED)


@pytest.mark.parametrize("mode", MODES, ids=MODE_NAMES)
def test_each_modes_devices_fit_plan_and_are_drawn_as_its_layout_kind(mode: DeviceMode) -> None:
    sample = _sample_gpu(mode)
    settings = mode.planned(sample, PlanAsks(((10 * GIB, 30),))) or GpuSettings(mode=mode.name)
    assert settings.mode == mode.name
    assert mode.fits(sample, settings, "default") is None

    config = NodeConfig(gpus=(GpuEntry(where="gpus[0]", index=sample.index, uuid=None, settings=settings),))
    node_plan = plan_node(config, [sample])
    assert node_plan.problems == ()
    inventory = build_inventory(node_plan.plans)

    assert inventory.devices
    assert layout_kind_of(inventory.devices) == mode.layout_kind
    assert mode.entered(sample, settings) == settings


def test_auto_offers_a_gpu_as_its_mig_states_auto_mode() -> None:
    for sample in simulated_node("mixed"):
        (plan,) = plan_node(NodeConfig(), [sample]).plans
        assert plan.mode == auto_mode(sample).name


def _mode_enums(schema: Any) -> Iterator[list[str]]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "mode" and isinstance(value, dict) and "enum" in value and AUTO in value["enum"]:
                yield value["enum"]
            yield from _mode_enums(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _mode_enums(value)


def test_the_committed_chart_schema_names_the_registrys_modes() -> None:
    enums = list(_mode_enums(json.loads(SCHEMA.read_text())))
    assert enums
    assert all(enum == list(CONFIG_MODES) for enum in enums)


def test_plan_mode_offers_the_registrys_modes() -> None:
    (commands,) = [a for a in build_parser("plan")._actions if isinstance(a, argparse._SubParsersAction)]
    plan = commands.choices["plan"]
    (mode_option,) = [action for action in plan._actions if action.dest == "mode"]
    assert tuple(mode_option.choices or ()) == MODE_NAMES
    help_text = plan.format_help()
    for mode in MODES:
        assert mode.name in help_text


def test_the_configuration_docs_table_lists_auto_and_the_registrys_modes_in_order() -> None:
    rows = re.findall(r"^\| `([a-z-]+)`(?: \(default\))? \|", CONFIGURATION_DOC.read_text(), re.MULTILINE)
    assert tuple(rows[: len(CONFIG_MODES)]) == CONFIG_MODES


# Mode names that are device types too ("gpu", "vfio"): as such they name a type, not a mode.
_ALSO_DEVICE_TYPES = set(MODE_NAMES) & set(get_args(DeviceType))


def _mode_constants(nodes: list[ast.expr]) -> set[str]:
    return {
        node.value
        for node in nodes
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in MODE_NAMES
        and node.value not in _ALSO_DEVICE_TYPES
    }


def mode_literals(source: str) -> list[str]:
    """Where a source names several modes in one collection (or Literal), compares a value with a
    mode's name, or tells modes apart by prefix: each a list or branch the registry should hold.
    "gpu" and "vfio" are also device types, so they are not counted."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        elements: list[ast.expr] = []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elements = list(node.elts)
        elif isinstance(node, ast.Dict):
            elements = [key for key in node.keys if key is not None]
        if len(_mode_constants(elements)) >= 2:
            found.append(f"line {line}: names {sorted(_mode_constants(elements))}")
        if isinstance(node, ast.Compare):
            named = _mode_constants([node.left, *node.comparators])
            if named:
                found.append(f"line {line}: compares with {sorted(named)}")
        if isinstance(node, ast.MatchValue) and _mode_constants([node.value]):
            found.append(f"line {line}: matches {sorted(_mode_constants([node.value]))}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
            and any(isinstance(arg, ast.Constant) and arg.value in ("mig-", "vgpu-") for arg in node.args)
        ):
            found.append(f"line {line}: tells modes apart by prefix")
    return found


def test_the_check_finds_the_lists_and_branches_it_looks_for() -> None:
    assert mode_literals('MODES = ("gpu", "mig-static", "vgpu-capacity")\n')
    assert mode_literals('Mode = Literal["auto", "mig-static", "mig-dynamic"]\n')
    assert mode_literals('if mode == "vgpu-partitions":\n    pass\n')
    assert mode_literals('match mode:\n    case "mig-static":\n        pass\n')
    assert mode_literals('if mode.startswith("vgpu-"):\n    pass\n')
    assert not mode_literals('if device_type == "gpu":\n    pass\nnote = "give it mode mig-dynamic"\n')


def test_no_list_or_branch_of_mode_names_is_left_outside_the_modes_package() -> None:
    sources = [*(REPOSITORY / "dra_driver").rglob("*.py"), *(REPOSITORY / "hack").rglob("*.py")]
    found = {}
    for path in sources:
        relative = path.relative_to(REPOSITORY).as_posix()
        if path.is_relative_to(MODES_PACKAGE) or "_proto" in path.parts:
            continue
        hits = mode_literals(path.read_text())
        if relative in PREFIX_CHECKS_ALLOWED:
            hits = [hit for hit in hits if not hit.endswith("by prefix")]
        if hits:
            found[relative] = hits
    assert found == {}
