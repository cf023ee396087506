"""The agent's start-up check of vgpu.enforcement against the HAMi-core library it was given."""

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver.agent.errors import SetupError
from dra_driver.agent.node import hami_core
from dra_driver.config.option_values import parse_hardware
from dra_driver.config.settings import NodeSettings
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import Enforcement, GpuSettings, NodeConfig
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


def vgpus(enforcement: Enforcement) -> NodeConfig:
    return NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement=enforcement))


def test_hami_core_enforcement_without_the_library_stops_the_agent_naming_the_setting() -> None:
    inventory = node_inventory(simulated_node("t4x4"), vgpus("hami-core"))

    with pytest.raises(SetupError, match=r"^vgpu.enforcement: hami-core for GPU 0 .* needs --hami-core-lib"):
        hami_core(settings(None), inventory)


def test_mps_needs_no_library_and_none_is_logged_as_enforcement_off() -> None:
    assert hami_core(settings(None), node_inventory(simulated_node("t4x4"), vgpus("mps"))) is None
    with capture_logs() as logs:
        assert hami_core(settings(None), node_inventory(simulated_node("t4x4"), vgpus("none"))) is None
    (entry,) = logs
    assert entry["log_level"] == "warning"
    assert entry["event"].startswith("vGPU enforcement is off for GPU 0")
    assert "their vgpu.enforcement is none" in entry["event"]


def test_with_the_library_hami_core_is_configured() -> None:
    inventory = node_inventory(simulated_node("t4x4"), vgpus("hami-core"))

    configured = hami_core(settings(Path("/usr/local/vgpu/libvgpu.so")), inventory)

    assert configured is not None and str(configured.library) == "/usr/local/vgpu/libvgpu.so"
