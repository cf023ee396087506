"""A named node config changed while the agent runs that asks for vgpu.enforcement hami-core on a
node whose agent has no --hami-core-library (issue 48): the GPU is a config problem, reported as
one, and offers nothing, so the scheduler never allocates a share every prepare would refuse.
The config the agent starts with stops it instead, as before (exit 2)."""

import asyncio
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from dra_driver.agent.errors import SetupError
from dra_driver.agent.node import NodeAgent
from dra_driver.agent.node_configs import CONFIG_POLL_SECONDS
from dra_driver.claims.source import OfflineClaimSource
from dra_driver.config.settings import NodeSettings
from tests.support.engines import agent_settings
from tests.support.node_configs import write_configmap

HAMI_ON_GPU_0 = (
    "default: {mode: auto}\ngpus: [{index: 0, mode: vgpu-capacity, vgpu: {enforcement: hami-core}}]\n"
)


def node_settings(root: Path) -> NodeSettings:
    return agent_settings(root, "simulated:t4x4", node_configs=root / "configs")


def problems(agent: NodeAgent) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["gpu"], sample.labels["setting"]): sample.value
        for family in text_string_to_metric_families(generate_latest(agent.metrics.registry).decode())
        for sample in family.samples
        if sample.name == "dra_driver_node_config_problems"
    }


async def test_a_later_config_asking_for_hami_core_without_the_library_leaves_the_gpu_out(
    short_dir: Path,
) -> None:
    settings = node_settings(short_dir)
    write_configmap(short_dir / "configs", {"default.yaml": "default: {mode: auto}\n"})

    async def run() -> list[MutableMapping[str, Any]]:
        agent = await NodeAgent.start(settings, OfflineClaimSource({}))
        try:
            assert {device.name for device in agent.inventory.devices} == {f"gpu-{i}" for i in range(4)}
            with capture_logs() as logs:
                write_configmap(short_dir / "configs", {"default.yaml": HAMI_ON_GPU_0})
                for _ in range(int(30 * CONFIG_POLL_SECONDS)):  # three polls, at most
                    if "gpu-0" not in agent.inventory.device_by_name:
                        break
                    await asyncio.sleep(0.1)
            assert {device.name for device in agent.inventory.devices} == {"gpu-1", "gpu-2", "gpu-3"}
            assert problems(agent) == {("0", "gpus[0].vgpu.enforcement"): 1.0}
            return logs
        finally:
            await agent.stop()

    logs = await run()
    (reported,) = [entry for entry in logs if str(entry["event"]).startswith("node config problem")]
    assert reported["log_level"] == "error"
    assert reported["setting"] == "gpus[0].vgpu.enforcement" and reported["gpu_index"] == 0
    assert "hami-core on GPU 0 (Tesla T4" in str(reported["problem"])
    assert "needs --hami-core-library" in str(reported["problem"])


async def test_the_config_the_agent_starts_with_asking_for_hami_core_without_the_library_stops_it(
    short_dir: Path,
) -> None:
    (short_dir / "node.yaml").write_text(HAMI_ON_GPU_0)
    settings = replace(node_settings(short_dir), node_configs=None, node_config=short_dir / "node.yaml")

    with pytest.raises(
        SetupError, match=r"^vgpu.enforcement: hami-core for GPU 0 .* needs --hami-core-library; "
    ):
        await NodeAgent.start(settings, OfflineClaimSource({}))
