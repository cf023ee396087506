"""MPS control daemons in pods of their own (--mps-daemons pod), with real processes throughout:
the claim engine creates the daemon's pod in the stand-in API server, the stand-in kubelet runs
the pod's command (the simulated nvidia-cuda-mps-control in the foreground), and the engine
talks to the daemon through its socket as it would on a GPU node."""

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from msgspec.structs import replace

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.effect_entries import ComputeModeEntry
from dra_driver.claims.engine import ClaimEngine, RawClaim, SharingControls
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.sharing.mps import SIMULATED_SETTINGS_FILE, SimulatedMps
from dra_driver.claims.sharing.mps_pod_spec import MpsPodSettings, daemon_pod_name
from dra_driver.claims.sharing.mps_pods import MpsDaemonPods
from dra_driver.claims.sharing.sharing import MpsDaemonSpec, MpsDirectories, gpu_daemon_key
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.pod_api import PodApi
from dra_driver.kube.server_access import ServerAccess
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import AgentDirs, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate_results
from tests.support.engines import PLAIN, POOL, simulated_engine, simulated_hardware
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import simulated_node
from tests.support.processes import process_alive
from tests.support.stand_in_kubelet import StandInKubelet
from tests.support.waiting import wait_until
from tests.unit.claims.test_engine_devices import sharing_config

NAMESPACE = "dra-driver"
IMAGE = "registry.example/dra-driver:test"


@pytest.fixture
def kubelet(kubeconfig: Path, short_dir: Path) -> Iterator[StandInKubelet]:
    (short_dir / "kubelet").mkdir()
    running = StandInKubelet(kubeconfig, POOL, NAMESPACE, short_dir / "kubelet").start()
    yield running
    running.stop()
    assert running.errors == []


def mps_claim(claims: MemoryClaims) -> RawClaim:
    return claims.add(
        "mps",
        {"device": "gpu-0"},
        {"request": "gpu", "device": "gpu-2"},
        config=sharing_config({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 40}}),
    )


class Node:
    """One agent's view of the node: its engine and its daemon runner, over a shared root."""

    def __init__(
        self,
        root: Path,
        server: ApiServer,
        claims: MemoryClaims,
        *,
        timeout_s: float = 15.0,
        gpus: SimulatedBackend | None = None,
        config: NodeConfig = PLAIN,
    ) -> None:
        """`gpus`: the node's GPUs, whose compute modes outlive an agent (one object for all)."""
        self.client = KubeClient(ServerAccess(server.url))
        local = SimulatedMps(root / "mps")
        command, environment = local.foreground_command()
        settings = MpsPodSettings(
            namespace=NAMESPACE,
            node_name=POOL,
            image=IMAGE,
            driver_root=Path("/"),
            host_driver_root=Path("/"),
            command=command,
            environment=environment,
            privileged=False,
        )
        self.pods = PodApi(self.client, NAMESPACE, POOL)
        self.daemons = MpsDaemonPods(local, self.pods, settings, start_timeout_s=timeout_s)
        slicer = SimulatedTimeSlicer(gpu.uuid for gpu in simulated_node("t4x4"))
        self.gpus = gpus or simulated_hardware(root, "t4x4")
        self.engine: ClaimEngine = simulated_engine(
            root,
            claims,
            config=config,
            sharing=SharingControls(slicer, self.daemons, compute_modes=self.gpus),
        )

    async def close(self) -> None:
        self.engine.close()
        await self.client.close()


def pods(server: ApiServer) -> dict[str, dict[str, Any]]:
    return {pod["metadata"]["name"]: pod for pod in server.objects("pods")}


async def test_a_claims_daemon_runs_in_its_pod_outlives_the_agent_and_goes_with_unprepare(
    apiserver: ApiServer, kubelet: StandInKubelet, short_dir: Path
) -> None:
    claims = MemoryClaims()
    claim = mps_claim(claims)
    uid = claim[2]
    name = daemon_pod_name(uid)
    directories = MpsDirectories(short_dir / "mps", uid)

    first = Node(short_dir, apiserver, claims)
    await first.engine.load_state()
    assert (await first.engine.prepare([claim]))[uid].error == ""
    pod = pods(apiserver)[name]
    assert pod["spec"]["nodeName"] == POOL
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    assert pod["metadata"]["labels"]["resource.kubernetes.io/claim-uid"] == uid
    pid = kubelet.pid_of(name)
    assert pid is not None and pid != os.getpid()
    # In use: the daemon got the claim's defaults through its socket.
    settings = json.loads((directories.pipe / SIMULATED_SETTINGS_FILE).read_text())
    assert settings["pid"] == pid
    assert settings["active_thread_percentage"] == 40
    # The claim's whole GPUs run only the MPS server's context while it is prepared.
    gpu_0, gpu_2 = simulated_node("t4x4")[0].uuid, simulated_node("t4x4")[2].uuid
    assert [await first.gpus.compute_mode(gpu) for gpu in (gpu_0, gpu_2)] == ["ExclusiveProcess"] * 2
    assert first.engine.prepared_claims[uid].entries(ComputeModeEntry) == (
        ComputeModeEntry(gpu_0, "Default"),
        ComputeModeEntry(gpu_2, "Default"),
    )
    await first.close()  # the agent goes (a rolling update)

    second = Node(short_dir, apiserver, claims, gpus=first.gpus)
    await second.engine.load_state()
    assert process_alive(pid)
    assert pods(apiserver)[name]["metadata"]["uid"] == pod["metadata"]["uid"]
    assert await second.daemons.is_running(uid)
    # A second prepare (kubelet repeats them) keeps the daemon it finds.
    assert (await second.engine.prepare([claim]))[uid].error == ""
    assert kubelet.pid_of(name) == pid

    assert await second.engine.unprepare([claim]) == {uid: ""}
    assert [await second.gpus.compute_mode(gpu) for gpu in (gpu_0, gpu_2)] == ["Default"] * 2
    assert name not in pods(apiserver)
    assert not directories.root.exists()
    wait_until(lambda: not process_alive(pid), timeout=10)
    settings_commands = settings["commands"]
    assert settings_commands == ["set_default_active_thread_percentage 40"]
    await second.close()


async def test_a_gpus_daemon_for_its_vgpu_shares_runs_in_one_pod_that_outlives_the_agent(
    apiserver: ApiServer, kubelet: StandInKubelet, short_dir: Path
) -> None:
    """vgpu.enforcement mps with --mps-daemons pod: the GPU's daemon is one pod, named and
    labelled as the admission policy allows (mps-<UUID part of the GPU UUID>), kept by a restarted
    agent's start-up (the shares' records name the GPU) and deleted with the last share."""
    claims = MemoryClaims()
    capacity = {"memory": "2Gi", "cores": "25"}
    shares = [
        claims.add(name, {"device": "gpu-0", "shareID": share_id, "consumedCapacity": capacity})
        for name, share_id in (
            ("a", "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"),
            ("b", "8d2e4b61-0a3f-4c5d-9e7f-1b2c3d4e5f60"),
        )
    ]
    key = gpu_daemon_key(simulated_node("t4x4")[0].uuid)
    config = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="mps"))

    first = Node(short_dir, apiserver, claims, config=config)
    await first.engine.load_state()
    outcomes = await first.engine.prepare(shares)
    assert [outcome.error for outcome in outcomes.values()] == ["", ""]
    assert [name for name in pods(apiserver) if name.startswith("mps-")] == [daemon_pod_name(key)]
    pod = pods(apiserver)[daemon_pod_name(key)]
    assert pod["metadata"]["labels"]["resource.kubernetes.io/claim-uid"] == key
    pid = kubelet.pid_of(daemon_pod_name(key))
    await first.close()

    second = Node(short_dir, apiserver, claims, config=config, gpus=first.gpus)
    await second.engine.load_state()
    assert kubelet.pid_of(daemon_pod_name(key)) == pid, "start-up keeps the GPU's daemon"
    assert await second.engine.unprepare([shares[0]]) == {shares[0][2]: ""}
    assert daemon_pod_name(key) in pods(apiserver)
    assert await second.engine.unprepare([shares[1]]) == {shares[1][2]: ""}
    assert daemon_pod_name(key) not in pods(apiserver)
    assert not (short_dir / "mps" / key).exists()
    await second.close()


async def test_a_daemon_that_does_not_answer_fails_the_prepare_and_leaves_nothing(
    apiserver: ApiServer, short_dir: Path
) -> None:
    """No kubelet runs the pod: it stays Pending and its daemon never answers."""
    claims = MemoryClaims()
    claim = mps_claim(claims)
    uid = claim[2]

    node = Node(short_dir, apiserver, claims, timeout_s=1.5)
    await node.engine.load_state()
    error = (await node.engine.prepare([claim]))[uid].error
    assert f"the MPS control daemon of claim {uid} did not answer on" in error
    assert f"pod {NAMESPACE}/{daemon_pod_name(uid)}: Pending" in error
    assert pods(apiserver) == {}
    assert not MpsDirectories(short_dir / "mps", uid).root.exists()
    assert node.engine.prepared_claims == {}
    await node.close()


async def test_start_up_removes_a_daemon_pod_no_record_owns_and_rolls_back_a_prepare_cut_short(
    apiserver: ApiServer, kubelet: StandInKubelet, short_dir: Path
) -> None:
    claims = MemoryClaims()
    orphan, cut_short = mps_claim(claims), claims.add("other", {"device": "gpu-1"})

    node = Node(short_dir, apiserver, claims)
    await node.engine.load_state()
    assert (await node.engine.prepare([orphan]))[orphan[2]].error == ""
    records = ClaimRecordStore(short_dir / "state")
    # A crash after the pod was created and before "prepared" was written: a "preparing"
    # record naming the daemon; and a crash after the record went but before the pod did.
    prepared = records.read(orphan[2])
    assert prepared is not None
    await records.erase(orphan[2])
    half = replace(prepared, claim=replace(prepared.claim, name=cut_short[1], uid=cut_short[2]))
    gpu_1 = simulated_node("t4x4")[1].uuid
    await records.write(
        replace(
            half,
            state="preparing",
            devices=(),
            effects=(*half.effects, ComputeModeEntry(gpu_1, "Prohibited")),
        )
    )
    await node.gpus.set_compute_mode(gpu_1, "ExclusiveProcess")
    spec = MpsDirectories(short_dir / "mps", cut_short[2])
    started = await _start_daemon(node, spec)
    assert set(pods(apiserver)) == {daemon_pod_name(orphan[2]), daemon_pod_name(cut_short[2])}
    # The orphan's directories are gone too (the node's /run was lost): only its pod is left.
    shutil.rmtree(MpsDirectories(short_dir / "mps", orphan[2]).root)
    await node.close()

    restarted = Node(short_dir, apiserver, claims, gpus=node.gpus)
    await restarted.engine.load_state()
    assert pods(apiserver) == {}
    assert await restarted.gpus.compute_mode(gpu_1) == "Prohibited"  # what the record said
    assert records.read(cut_short[2]) is None
    wait_until(lambda: not any(process_alive(pid) for pid in started), timeout=10)
    await restarted.close()


async def _start_daemon(node: Node, directories: MpsDirectories) -> list[int]:
    """Starts a daemon for `directories`' claim as prepare would; answers the PIDs of the
    daemons running then."""
    gpu = simulated_node("t4x4")[1].uuid
    await node.daemons.start(MpsDaemonSpec(directories, (gpu,)))
    return [
        json.loads((entry / "pipe" / SIMULATED_SETTINGS_FILE).read_text())["pid"]
        for entry in node.daemons.runtime_dir.iterdir()
    ]


# --- The agent process (`dra-driver node --mps-daemons pod`) -------------------------------------


async def test_the_agent_runs_a_claims_daemon_in_a_pod_that_outlives_a_kill_9_of_the_agent(
    apiserver: ApiServer,
    kubeconfig: Path,
    claims_api: client.ResourceV1Api,
    kubelet: StandInKubelet,
    short_dir: Path,
) -> None:
    dirs = AgentDirs(root=short_dir / "node")
    options = ("--mps-daemons", "pod", "--mps-daemon-image", IMAGE, "--namespace", NAMESPACE)
    config = sharing_config({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}})
    for entry in config:
        entry["opaque"]["driver"] = DEFAULT_DRIVER_NAME
    uid = allocate_results(
        claims_api,
        "shared",
        [{"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": POOL, "device": "gpu-0"}],
        config,
    )
    claim = ClaimArg("default", "shared", uid)
    name = daemon_pod_name(uid)
    agent = start_agent(dirs, kubeconfig, extra=options)
    try:
        answer = (await kubelet_client.prepare(dirs.dra_socket, "v1", [claim]))["claims"][uid]
        assert answer["error"] == "", agent.log_path.read_text()
        pod = pods(apiserver)[name]
        pid = kubelet.pid_of(name)
        assert pid is not None
        settings = json.loads(
            (MpsDirectories(dirs.root / "mps", uid).pipe / SIMULATED_SETTINGS_FILE).read_text()
        )
        assert (settings["pid"], settings["active_thread_percentage"]) == (pid, 25)

        assert agent.terminate(signal.SIGKILL) == -signal.SIGKILL
        assert process_alive(pid)
        agent = start_agent(dirs, kubeconfig, extra=options)
        assert process_alive(pid) and kubelet.pid_of(name) == pid
        assert pods(apiserver)[name]["metadata"]["uid"] == pod["metadata"]["uid"]

        unprepared = (await kubelet_client.unprepare(dirs.dra_socket, "v1", [claim]))["claims"]
        assert unprepared == {uid: {"error": ""}}
        assert name not in pods(apiserver)
        wait_until(lambda: not process_alive(pid), timeout=10)
    finally:
        agent.terminate()


async def test_start_up_does_not_wait_for_the_api_server_to_list_daemon_pods(
    apiserver: ApiServer, short_dir: Path
) -> None:
    """A leftover daemon directory is still swept; the pods are looked for at the next start."""
    leftover = MpsDirectories(short_dir / "mps", "6a0e1c2b-3d4f-4a5b-8c6d-7e8f9a0b1c2d")
    leftover.pipe.mkdir(parents=True)

    node = Node(short_dir, apiserver, MemoryClaims())
    apiserver.faults.fail_next, apiserver.faults.fail_status = 1, 503
    apiserver.faults.fail_methods = frozenset({"GET"})
    await node.engine.load_state()
    assert not leftover.root.exists()
    assert apiserver.faults.fail_next == 0  # the list was tried, and refused
    await node.close()


async def test_a_dead_daemons_pod_is_replaced_and_a_pod_someone_deleted_does_not_stop_unprepare(
    apiserver: ApiServer, kubelet: StandInKubelet, short_dir: Path
) -> None:
    claims = MemoryClaims()
    claim = mps_claim(claims)
    uid, name = claim[2], daemon_pod_name(claim[2])
    directories = MpsDirectories(short_dir / "mps", uid)
    gpu = simulated_node("t4x4")[0].uuid

    node = Node(short_dir, apiserver, claims)
    await node.engine.load_state()
    await node.daemons.start(MpsDaemonSpec(directories, (gpu,), active_thread_percentage=10))
    first_pod, first_pid = pods(apiserver)[name]["metadata"]["uid"], kubelet.pid_of(name)
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    wait_until(lambda: pods(apiserver)[name].get("status", {}).get("phase") == "Failed", timeout=10)
    assert not await node.daemons.is_running(uid)

    await node.daemons.start(MpsDaemonSpec(directories, (gpu,), active_thread_percentage=10))
    assert pods(apiserver)[name]["metadata"]["uid"] != first_pod
    assert await node.daemons.is_running(uid)
    settings = json.loads((directories.pipe / SIMULATED_SETTINGS_FILE).read_text())
    assert settings["commands"] == ["set_default_active_thread_percentage 10"]

    second_pid = kubelet.pid_of(name)
    assert second_pid is not None and second_pid != first_pid
    await node.pods.delete(name)  # an administrator's doing
    wait_until(lambda: not process_alive(second_pid), timeout=10)
    await node.daemons.stop(uid)
    assert not directories.root.exists()
    await node.close()
