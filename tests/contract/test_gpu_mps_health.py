"""A GPU's MPS daemon (vGPU shares under vgpu.enforcement mps) that dies while nothing is being
prepared: the real agent process finds it by its periodic probe, reports the share's device
Unhealthy on the kubelet health stream, naming the daemon, the GPU and what to do, and shows 0 in
/metrics; the next prepare on the GPU restarts the daemon and the device is Healthy again."""

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto.dra_health.v1 import api_pb2 as health_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as health_grpc
from dra_driver.claims.sharing.mps import daemon_pid
from dra_driver.claims.sharing.sharing import MpsDirectories, gpu_daemon_key
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate_results
from tests.support.nodes import simulated_node

POOL = "node-a"
GPU = simulated_node("t4x4")[0]
PROBE_SECONDS = 0.2
# Many probe intervals, for a busy machine.
WITHIN = 10.0

Devices = dict[str, tuple[int, str]]


def share(api: client.ResourceV1Api, name: str) -> ClaimArg:
    result = {
        "request": "gpu",
        "driver": DEFAULT_DRIVER_NAME,
        "pool": POOL,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "1Gi", "cores": "10"},
    }
    return ClaimArg("default", name, allocate_results(api, name, [result]))


async def prepare(agent: AgentProcess, claim: ClaimArg) -> None:
    answer = await kubelet_client.prepare(agent.dirs.dra_socket, "v1", [claim])
    assert answer["claims"][claim.uid]["error"] == "", answer


async def unprepare(agent: AgentProcess, claims: list[ClaimArg]) -> None:
    answer = await kubelet_client.unprepare(agent.dirs.dra_socket, "v1", claims)
    assert all(answer["claims"][claim.uid]["error"] == "" for claim in claims), answer


def daemon_up(agent: AgentProcess) -> float | None:
    return agent.scrape().get(("dra_driver_gpu_mps_daemon_up", (("gpu", GPU.uuid),)))


async def health_until(socket: Path, done: Callable[[Devices], bool]) -> Devices:
    """The device lists of the health stream until one satisfies `done` (or WITHIN runs out)."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        try:
            deadline = time.monotonic() + WITHIN
            while True:
                response: Any = await asyncio.wait_for(stream.read(), max(0.0, deadline - time.monotonic()))
                devices = {d.device.device_name: (d.health, d.message) for d in response.devices}
                if done(devices):
                    return devices
        finally:
            stream.cancel()


@pytest.fixture
def agent(short_dir: Path, kubeconfig: Path) -> Iterator[AgentProcess]:
    config = short_dir / "node-config.yaml"
    config.write_text("default: {mode: vgpu-capacity, vgpu: {enforcement: mps}}\n")
    agent = start_agent(
        AgentDirs(root=short_dir / "node"),
        kubeconfig,
        hardware="simulated:t4x4",
        extra=("--node-config", str(config), "--mps-probe-interval", str(PROBE_SECONDS)),
    )
    yield agent
    agent.terminate()


async def test_a_dead_gpu_daemon_makes_its_shares_device_unhealthy_until_the_next_prepare_restarts_it(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    first = share(claims_api, "first")
    await prepare(agent, first)
    socket = agent.dirs.dra_socket
    healthy = await health_until(socket, lambda devices: "gpu-0" in devices)
    assert {name: health for name, (health, _) in healthy.items()} == dict.fromkeys(
        ("gpu-0", "gpu-1", "gpu-2", "gpu-3"), health_pb2.HEALTHY
    )
    assert daemon_up(agent) == 1

    key = gpu_daemon_key(GPU.uuid)
    pid = daemon_pid(MpsDirectories(agent.dirs.root / "mps", key))
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    down = await health_until(socket, lambda devices: devices["gpu-0"][0] == health_pb2.UNHEALTHY)
    assert time.monotonic() - killed_at < WITHIN
    message = down["gpu-0"][1]
    assert (
        f"the MPS control daemon {key} of GPU {GPU.uuid} (vgpu.enforcement: mps) has not answered" in message
    )
    assert "restart them (the next prepare of a share on this GPU restarts the daemon)" in message
    assert all(down[name][0] == health_pb2.HEALTHY for name in ("gpu-1", "gpu-2", "gpu-3")), (
        "the other GPUs have daemons of their own, or none"
    )
    assert daemon_up(agent) == 0

    second = share(claims_api, "second")
    await prepare(agent, second)  # restarts the GPU's daemon
    again = await health_until(socket, lambda devices: devices["gpu-0"][0] == health_pb2.HEALTHY)
    assert again["gpu-0"] == (health_pb2.HEALTHY, "")
    assert daemon_pid(MpsDirectories(agent.dirs.root / "mps", key)) not in (None, pid)
    assert daemon_up(agent) == 1

    # The daemon outlives the agent, as a real one does: it stops with the GPU's last share.
    await unprepare(agent, [first, second])
    assert daemon_pid(MpsDirectories(agent.dirs.root / "mps", key)) is None
