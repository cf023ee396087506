"""The agent's start-up check of vgpu.enforcement against the HAMi-core library it was given:
planning leaves such a GPU out with a problem, which the config the agent starts with makes fatal."""

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver.agent.claim_serving import hami_core
from dra_driver.agent.errors import SetupError
from dra_driver.config.option_values import parse_hardware
from dra_driver.config.settings import NodeSettings
from dra_driver.devices.inventory import Inventory, build_inventory
from dra_driver.devices.node_config import ConfigProblem, Enforcement, GpuSettings, NodeConfig, plan_node
from tests.support.nodes import simulated_node


def settings(library: Path | None) -> NodeSettings:
    root = Path("/run/test")
    return NodeSettings(
        node_name="node-a",
        driver_name="gpu.dra-driver.dev",
        hardware=parse_hardware("simulated:t4x4"),
        node_config=None,
        registrar_dir=root,
        plugins_dir=root,
        cdi_dir=root,
        state_dir=root,
        kubeconfig=None,
        log_format="json",
        verbosity=0,
        hami_core_library=library,
    )


def planned(enforcement: Enforcement, library: Path | None) -> tuple[Inventory, tuple[ConfigProblem, ...]]:
    config = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement=enforcement))
    node_plan = plan_node(config, simulated_node("t4x4"), hami_core=library is not None)
    return build_inventory(node_plan.plans), node_plan.problems


def test_hami_core_enforcement_without_the_library_stops_the_agent_naming_the_setting() -> None:
    inventory, problems = planned("hami-core", None)

    assert inventory.devices == () and len(problems) == 4
    with pytest.raises(SetupError, match=r"^vgpu.enforcement: hami-core for GPU 0 .* needs --hami-core-lib"):
        hami_core(settings(None), inventory, problems)


def test_mps_needs_no_library_and_none_is_logged_as_enforcement_off() -> None:
    assert hami_core(settings(None), *planned("mps", None)) is None
    with capture_logs() as logs:
        assert hami_core(settings(None), *planned("none", None)) is None
    (entry,) = logs
    assert entry["log_level"] == "warning"
    assert entry["event"].startswith("vGPU enforcement is off for GPU 0")
    assert "their vgpu.enforcement is none" in entry["event"]


def test_with_the_library_hami_core_is_configured() -> None:
    library = Path("/usr/local/vgpu/libvgpu.so")

    configured = hami_core(settings(library), *planned("hami-core", library))

    assert configured is not None and str(configured.library) == "/usr/local/vgpu/libvgpu.so"
