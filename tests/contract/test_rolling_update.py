"""A rolling update on one node, with real processes: the old and the new agent pod overlap on
one state directory, each with sockets named by its pod UID (as kubelet >= 1.33 expects). Calls
for one claim may reach either; exactly one publishes; the new one takes over when the old stops.
"""

import signal
from pathlib import Path
from typing import Any

from kubernetes import client

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import NodeConfig
from dra_driver.plugin.sockets import registration_socket_path
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate
from tests.support.nodes import simulated_node
from tests.support.publishing import SLICES, pool_problems
from tests.support.waiting import wait_until

OLD_POD = "0a0a0a0a-1111-4111-8111-000000000001"
NEW_POD = "0b0b0b0b-2222-4222-8222-000000000002"
DGX_H100 = node_inventory(simulated_node("dgx-h100"), NodeConfig())
TAKING_OVER = "taking over publishing the ResourceSlices"
WAITING = "another agent on this node publishes the ResourceSlices; taking over when it stops"


def agent_pod(dirs: AgentDirs, kubeconfig: Path, pod_uid: str) -> AgentProcess:
    return start_agent(dirs, kubeconfig, extra=("--pod-uid", pod_uid))


def dra_socket(dirs: AgentDirs, pod_uid: str) -> Path:
    return dirs.state_dir / f"dra-{pod_uid}.sock"


def registration_socket(dirs: AgentDirs, pod_uid: str) -> Path:
    return registration_socket_path(dirs.registrar_dir, dirs.driver_name, pod_uid)


async def prepare(dirs: AgentDirs, pod_uid: str, claim: ClaimArg) -> dict[str, Any]:
    answer = await kubelet_client.prepare(dra_socket(dirs, pod_uid), "v1", [claim])
    result: dict[str, Any] = answer["claims"][claim.uid]
    return result


async def unprepare(dirs: AgentDirs, pod_uid: str, claim: ClaimArg) -> str:
    answer = await kubelet_client.unprepare(dra_socket(dirs, pod_uid), "v1", [claim])
    error: str = answer["claims"][claim.uid]["error"]
    return error


async def test_old_and_new_agents_serve_side_by_side_and_the_new_one_takes_over(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path, claims_api: client.ResourceV1Api
) -> None:
    old = agent_pod(agent_dirs, kubeconfig, OLD_POD)
    new = None
    try:
        old.wait_for_log("resourceslices published")
        new = agent_pod(agent_dirs, kubeconfig, NEW_POD)
        new.wait_for_log(WAITING)
        assert {p.name for p in agent_dirs.registrar_dir.iterdir()} == {
            registration_socket(agent_dirs, OLD_POD).name,
            registration_socket(agent_dirs, NEW_POD).name,
        }
        assert dra_socket(agent_dirs, OLD_POD).is_socket() and dra_socket(agent_dirs, NEW_POD).is_socket()

        first = ClaimArg("default", "first", allocate(claims_api, "first", {"gpu": "gpu-3"}, pool="node-a"))
        second = ClaimArg(
            "default", "second", allocate(claims_api, "second", {"gpu": "gpu-3"}, pool="node-a")
        )
        prepared = await prepare(agent_dirs, NEW_POD, first)
        assert prepared["error"] == "" and [d["device_name"] for d in prepared["devices"]] == ["gpu-3"]
        assert await prepare(agent_dirs, OLD_POD, first) == prepared, (
            "a retry on the other agent: same answer"
        )
        refused = (await prepare(agent_dirs, OLD_POD, second))["error"]
        assert "device gpu-3 is already prepared for claim default/first" in refused
        assert await unprepare(agent_dirs, OLD_POD, first) == ""
        assert not (agent_dirs.state_dir / "claims" / f"{first.uid}.json").exists()
        assert (await prepare(agent_dirs, NEW_POD, second))["error"] == ""

        apiserver.reset_counts()
        assert old.terminate() == 0
        new.wait_for_log(TAKING_OVER, timeout=10)
        assert not registration_socket(agent_dirs, OLD_POD).exists()
        assert not dra_socket(agent_dirs, OLD_POD).exists()
        wait_until(lambda: apiserver.request_count("WATCH", SLICES) >= 1)
        assert pool_problems(apiserver, DGX_H100) == []
        assert apiserver.writes(SLICES) == 0, "the new agent adopts the slices as they are"
        assert await unprepare(agent_dirs, NEW_POD, second) == ""
        assert list(agent_dirs.cdi_dir.glob("*claim_*")) == []
    finally:
        for agent in (new, old):
            if agent is not None:
                agent.terminate()
    assert new is not None and WAITING not in old.log_events() and TAKING_OVER not in old.log_events()


def test_sockets_of_a_killed_agent_pod_are_removed_by_the_next_one(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path
) -> None:
    killed = agent_pod(agent_dirs, kubeconfig, OLD_POD)
    killed.terminate(signal.SIGKILL)
    dead = (registration_socket(agent_dirs, OLD_POD), dra_socket(agent_dirs, OLD_POD))
    assert all(path.is_socket() for path in dead), "SIGKILL leaves the sockets behind"
    apiserver.reset_counts()
    replacement = agent_pod(agent_dirs, kubeconfig, NEW_POD)
    try:
        assert not any(path.exists() for path in dead)
        removed = [
            line["path"]
            for line in replacement.log_lines()
            if line.get("event", "").startswith("removed a socket")
        ]
        assert sorted(removed) == sorted(map(str, dead))
        assert registration_socket(agent_dirs, NEW_POD).is_socket()
        # The killed agent's publisher lock died with it: no waiting for a peer.
        wait_until(lambda: apiserver.request_count("WATCH", SLICES) >= 1)
        assert WAITING not in replacement.log_events()
    finally:
        replacement.terminate()
