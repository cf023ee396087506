"""Faults injected into a running agent's simulated GPUs become exactly the expected taints in
the slices at the API server, and the taints go once the GPU has been quiet long enough; the
kubelet health stream follows."""

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as health_pb2
from dra_driver._proto.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.nodes import simulated_node
from tests.support.publishing import stored_slices
from tests.support.waiting import wait_until

DRIVER = "gpu.dra-driver.dev"


def taints(server: ApiServer) -> dict[str, list[tuple[str, str, str]]]:
    found: dict[str, list[tuple[str, str, str]]] = {}
    for stored in stored_slices(server):
        for device in stored["spec"].get("devices", []):
            if device.get("taints"):
                found[device["name"]] = [
                    (t["key"], t.get("value", ""), t["effect"]) for t in device["taints"]
                ]
    return found


def inject(dirs: AgentDirs, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "dra_driver", "simulate-fault", "--state-dir", str(dirs.state_dir), *args],
        check=True,
        capture_output=True,
        timeout=30,
    )


async def health_snapshot(socket: Path) -> dict[str, int]:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        first: Any = await stream.read()
        stream.cancel()
        return {device.device.device_name: device.health for device in first.devices}


async def test_an_xid_taints_its_gpu_until_it_recovers_and_a_lost_gpu_stays_tainted(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path
) -> None:
    agent = start_agent(agent_dirs, kubeconfig, extra=("--health-recovery", "2"))
    try:
        agent.wait_for_log("resourceslices published")
        assert taints(apiserver) == {}

        inject(agent_dirs, "--gpu", "1", "--xid", "48")
        wait_until(lambda: bool(taints(apiserver)), timeout=10)
        tainted_at = time.monotonic()
        assert taints(apiserver) == {"gpu-1": [(f"{DRIVER}/xid", "48", "NoExecute")]}
        health = await health_snapshot(agent_dirs.dra_socket)
        assert health["gpu-1"] == health_pb2.UNHEALTHY and health["gpu-0"] == health_pb2.HEALTHY

        wait_until(lambda: taints(apiserver) == {}, timeout=10)
        assert time.monotonic() - tainted_at >= 1.5, "the taint stayed for the recovery period"
        assert (await health_snapshot(agent_dirs.dra_socket))["gpu-1"] == health_pb2.HEALTHY

        inject(agent_dirs, "--gpu", "3", "--xid", "13")  # an application error: ignored
        inject(agent_dirs, "--gpu", "2", "--lost")
        wait_until(lambda: "gpu-2" in taints(apiserver), timeout=10)
        await asyncio.sleep(3)  # longer than the recovery period: a lost GPU does not recover
        assert taints(apiserver) == {"gpu-2": [(f"{DRIVER}/gpu-lost", "true", "NoExecute")]}
    finally:
        agent.terminate()


def test_a_fault_for_a_gpu_the_agent_does_not_have_is_refused(agent: AgentProcess) -> None:
    """The command checks the GPU against the running agent's own list, instead of queueing a
    fault that the agent would only log and drop."""
    state_dir = str(agent.dirs.state_dir)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver",
            "simulate-fault",
            "--state-dir",
            state_dir,
            "--gpu",
            "99",
            "--xid",
            "48",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert result.returncode == 2
    gpus = simulated_node("dgx-h100")
    listed = ", ".join(f"{gpu.index} ({gpu.uuid})" for gpu in gpus)
    assert result.stderr == f"dra-driver simulate-fault: --gpu no GPU '99' on this node; GPUs: {listed}\n"
    assert list((agent.dirs.state_dir / "simulated-faults").glob("*.json")) == [
        agent.dirs.state_dir / "simulated-faults" / "gpus.json"
    ]
