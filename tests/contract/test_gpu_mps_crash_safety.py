"""Crash safety of the per-GPU MPS daemons of vGPU shares (vgpu.enforcement: mps): the agent is
killed with SIGKILL at every step a share's prepare or unprepare passes, restarted, and the node
must come out whole.

After every crash and restart: no orphan daemon (the daemons running are exactly those of GPUs
that prepared records name, and each of them answers), no lost share (the bystander stays
prepared, the victim is prepared or gone without a trace), and preparing and unpreparing the
victim afterwards works and leaves the daemons in step again. Two cases: the victim shares its GPU
with the bystander (the daemon must survive the victim), and the victim is its GPU's only share
(its daemon must go with it).
"""

import json
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.sharing.mps import daemon_pid
from dra_driver.claims.sharing.sharing import MpsDirectories, gpu_daemon_key
from dra_driver.state import failpoints
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg, KubeletClientError
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate_results
from tests.support.nodes import simulated_node

HARDWARE = "simulated:t4x4"
POOL = "node-a"
GPUS = {f"gpu-{gpu.index}": gpu.uuid for gpu in simulated_node("t4x4")}
# Every point a share's prepare or unprepare passes, once each.
POINTS = (
    "prepare.gpu-mps-started",
    "prepare.metadata-written",
    "prepare.cdi-written",
    "prepare.prepared-recorded",
    "unprepare.gpu-mps-stopped",
    "unprepare.record-deleted",
    "unprepare.cdi-removed",
    "unprepare.metadata-removed",
)


@dataclass(frozen=True, slots=True)
class Share:
    name: str
    uid: str
    device: str

    @property
    def arg(self) -> ClaimArg:
        return ClaimArg("default", self.name, self.uid)


def share(api: client.ResourceV1Api, name: str, device: str) -> Share:
    result = {
        "request": "gpu",
        "driver": DEFAULT_DRIVER_NAME,
        "pool": POOL,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "1Gi", "cores": "10"},
    }
    return Share(name, allocate_results(api, name, [result]), device)


class Node:
    def __init__(self, root: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dirs = AgentDirs(root=root / "node")
        self._kubeconfig = kubeconfig
        self._monkeypatch = monkeypatch
        self._config = root / "node-config.yaml"
        self._config.write_text("default: {mode: vgpu-capacity, vgpu: {enforcement: mps}}\n")
        self.agent: AgentProcess | None = None

    def start(self, armed: str = "") -> None:
        if armed:
            self._monkeypatch.setenv(failpoints.ENVIRONMENT_VARIABLE, armed)
        try:
            self.agent = start_agent(
                self.dirs, self._kubeconfig, hardware=HARDWARE, extra=("--node-config", str(self._config))
            )
        finally:
            self._monkeypatch.delenv(failpoints.ENVIRONMENT_VARIABLE, raising=False)

    def stop(self) -> None:
        assert self.agent is not None
        self.agent.terminate(signal.SIGKILL)

    async def call(self, verb: str, *shares: Share) -> dict[str, Any] | None:
        """The claims' answers, or None when the agent was killed meanwhile."""
        assert self.agent is not None
        call = kubelet_client.prepare if verb == "prepare" else kubelet_client.unprepare
        try:
            answer = await call(self.dirs.dra_socket, "v1", [s.arg for s in shares])
        except KubeletClientError:
            assert self.agent.process.wait(timeout=30) == -signal.SIGKILL, self.agent.log_path.read_text()
            return None
        claims: dict[str, Any] = answer["claims"]
        return claims

    def records(self) -> dict[str, dict[str, Any]]:
        return {
            path.name.removesuffix(".json"): json.loads(path.read_text())
            for path in (self.dirs.state_dir / "claims").glob("*.json")
        }

    def daemons(self) -> dict[str, bool]:
        """Every daemon directory under the MPS runtime directory, and whether its daemon runs."""
        runtime = self.dirs.root / "mps"
        if not runtime.is_dir():
            return {}
        return {
            entry.name: daemon_pid(MpsDirectories(runtime, entry.name)) is not None
            for entry in runtime.iterdir()
        }

    def assert_at_rest(self) -> dict[str, dict[str, Any]]:
        records = self.records()
        assert {record["state"] for record in records.values()} <= {"prepared"}, "a record left preparing"
        named = {gpu for record in records.values() for gpu in record.get("mpsGPUs", [])}
        assert self.daemons() == {gpu_daemon_key(gpu): True for gpu in named}, (
            "daemons out of step with the GPUs prepared shares name (an orphan, or a share without one)"
        )
        return records

    def kill(self) -> None:
        if self.agent is not None and self.agent.process.poll() is None:
            self.agent.terminate(signal.SIGKILL)


@pytest.fixture
def node(short_dir: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    node = Node(short_dir, kubeconfig, monkeypatch)
    yield node
    node.kill()


@pytest.mark.parametrize("victim_device", ["gpu-0", "gpu-1"], ids=["gpu-shared", "gpu-alone"])
@pytest.mark.parametrize("point", POINTS)
async def test_a_crash_at_any_step_leaves_no_orphan_daemon_and_no_lost_share(
    node: Node, claims_api: client.ResourceV1Api, point: str, victim_device: str
) -> None:
    bystander = share(claims_api, "bystander", "gpu-0")
    victim = share(claims_api, "victim", victim_device)
    if point.startswith("prepare."):
        node.start(armed=f"{point}@2")  # the bystander's prepare passes it once
        prepared = await node.call("prepare", bystander)
        assert prepared is not None and prepared[bystander.uid]["error"] == ""
        answer = await node.call("prepare", victim)
        assert answer is None, f"{point} was passed but did not kill"
    else:
        node.start(armed=f"{point}@1")
        prepared = await node.call("prepare", bystander, victim)
        assert prepared is not None and all(a["error"] == "" for a in prepared.values())
        answer = await node.call("unprepare", victim)
        passes = point != "unprepare.gpu-mps-stopped" or victim_device != "gpu-0"
        assert (answer is None) == passes, f"{point}: killed {answer is None}, expected {passes}"
        if answer is not None:
            node.stop()

    node.start()
    records = node.assert_at_rest()
    assert records[bystander.uid]["state"] == "prepared", "the bystander's share was lost"
    assert GPUS["gpu-0"] in records[bystander.uid]["mpsGPUs"]

    first = await node.call("prepare", victim)
    assert first is not None and first[victim.uid]["error"] == ""
    assert await node.call("prepare", victim) == first
    records = node.assert_at_rest()
    assert set(records) == {bystander.uid, victim.uid}

    assert await node.call("unprepare", victim) == {victim.uid: {"error": ""}}
    assert set(node.assert_at_rest()) == {bystander.uid}
    assert await node.call("unprepare", bystander) == {bystander.uid: {"error": ""}}
    assert node.assert_at_rest() == {}
    assert node.daemons() == {}, "the last share's unprepare stops its GPU's daemon"
