"""`dra-driver node --hardware nvml` as a real process on the mock libnvidia-ml.so.1 under a driver
root: it publishes what `--hardware simulated:<same profile>` publishes, prepares whole GPUs and
dynamic MIG devices through NVML, turns an injected XID into a taint, and waits for a driver that
is not there yet instead of exiting."""

import json
import platform
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.inventory import node_inventory
from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg, KubeletClientError
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate, allocate_results
from tests.support.driver_trees import write_loader_cache
from tests.support.mock_nvml import LIBRARY_DIR, WITHOUT_HOST_NVML, MockNode, make_driver_root
from tests.support.nodes import simulated_node
from tests.support.publishing import pool_problems, stored_slices
from tests.support.waiting import wait_until

DRIVER = "gpu.dra-driver.dev"
NODE_CONFIG = """\
gpus:
  - {index: 2, mode: mig-dynamic}
  - {index: 3, mode: mig-dynamic}
  - {index: 4, mode: vgpu-capacity, vgpu: {enforcement: none}}  # the mock driver has no MPS control
"""
SHARE = "3f0c2a9e-8b7d-4c6e-9a5f-1d2e3c4b5a69"
WAITING = "the NVIDIA driver is not there yet"
# Each look after the first, logged at debug level (the agent runs with -v to show them).
LOOKED_AGAIN = "NVIDIA driver still missing"


def agent_on_mock(
    dirs: AgentDirs,
    kubeconfig: Path,
    node: MockNode,
    driver_root: Path,
    wait: bool = True,
    env: dict[str, str] | None = None,
    host_driver_root: str | None = None,
    more: tuple[str, ...] = (),
) -> AgentProcess:
    node_config = dirs.root / "node-config.yaml"
    node_config.write_text(NODE_CONFIG)
    extra = (
        *("--driver-root", str(driver_root), "--sysfs-root", str(node.sysfs), "--proc-root", str(node.proc)),
        *("--node-config", str(node_config), "--health-recovery", "300"),
        *(("--host-driver-root", host_driver_root) if host_driver_root else ()),
        *more,
    )
    return start_agent(dirs, kubeconfig, "nvml", extra, wait=wait, env={**node.environment(), **(env or {})})


@pytest.fixture
def mock_node(agent_dirs: AgentDirs) -> MockNode:
    return MockNode.create(agent_dirs.root / "mock", NODE_NAME, "mixed")


@pytest.fixture
def nvml_agent(agent_dirs: AgentDirs, kubeconfig: Path, mock_node: MockNode) -> Iterator[AgentProcess]:
    driver_root = make_driver_root(agent_dirs.root / "driver", DEFAULT_DRIVER_VERSION)
    agent = agent_on_mock(agent_dirs, kubeconfig, mock_node, driver_root)
    agent.wait_for_log("resourceslices published")
    yield agent
    agent.terminate()


def taints(server: ApiServer) -> dict[str, list[tuple[str, str, str]]]:
    return {
        device["name"]: [(t["key"], t.get("value", ""), t["effect"]) for t in device["taints"]]
        for stored in stored_slices(server)
        for device in stored["spec"].get("devices", [])
        if device.get("taints")
    }


def mig_state(node: MockNode) -> list[str]:
    return node.state_file.read_text().splitlines() if node.state_file.exists() else []


async def test_the_agent_on_the_mock_publishes_what_the_simulated_node_does_and_prepares_through_nvml(
    nvml_agent: AgentProcess, apiserver: ApiServer, claims_api: client.ResourceV1Api, mock_node: MockNode
) -> None:
    dirs = nvml_agent.dirs
    config = dirs.root / "node-config.yaml"
    expected = node_inventory(simulated_node("mixed", NODE_NAME), load_node_config(config))
    assert pool_problems(apiserver, expected) == []

    whole = allocate(claims_api, "whole", {"gpu": "gpu-6"}, pool=NODE_NAME)
    static = allocate(claims_api, "static", {"mig": "gpu-0-mig-1g10gb-2"}, pool=NODE_NAME)
    dynamic = allocate(claims_api, "dynamic", {"mig": "gpu-2-mig-1g10gb-3"}, pool=NODE_NAME)
    share = {"shareID": SHARE, "consumedCapacity": {"memory": "8Gi", "cores": "20"}}
    vgpu = allocate_results(
        claims_api,
        "vgpu",
        [{"request": "v", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-4", **share}],
    )
    names = {whole: "whole", static: "static", dynamic: "dynamic", vgpu: "vgpu"}
    claims = [ClaimArg("default", name, uid) for uid, name in names.items()]
    prepared = (await kubelet_client.prepare(dirs.dra_socket, "v1", claims))["claims"]

    assert {uid: answer["error"] for uid, answer in prepared.items()} == dict.fromkeys(names, "")
    assert mig_state(mock_node)[-2:] == ["gi 2 1 19 3 1", "ci 2 1 0 0"]
    specs = "".join(path.read_text() for path in dirs.cdi_dir.glob("*.json"))
    assert f"{dirs.root}/driver/{LIBRARY_DIR}/libnvidia-ml.so.{DEFAULT_DRIVER_VERSION}" in specs
    dynamic_spec = json.loads((dirs.cdi_dir / f"k8s.{DRIVER}-claim_{dynamic}.json").read_text())
    nodes = [n["path"] for d in dynamic_spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    # The GPU's node, and the GPU and compute instance's capabilities (the mock's minors).
    assert nodes == ["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap1528", "/dev/nvidia-caps/nvidia-cap1529"]

    static_spec = json.loads((dirs.cdi_dir / f"k8s.{DRIVER}-claim_{static}.json").read_text())
    assert "/dev/nvidia-caps/nvidia-cap1033" in json.dumps(static_spec)  # GPU 0, GPU instance 2

    vgpu_spec = json.loads((dirs.cdi_dir / f"k8s.{DRIVER}-claim_{vgpu}.json").read_text())
    assert "/dev/nvidia4" in json.dumps(vgpu_spec)

    unprepared = (await kubelet_client.unprepare(dirs.dra_socket, "v1", claims))["claims"]
    assert unprepared == {uid: {"error": ""} for uid in names}
    assert not any(line.startswith("gi 2 ") for line in mig_state(mock_node))
    assert "gi 0 2 19 2 1" in mig_state(mock_node)  # a static instance stays


def host_paths(document: object) -> list[str]:
    """Every host path a CDI spec names: mounts' and device nodes' (a node without one is the
    same path on the host as in the container)."""
    if isinstance(document, list):
        return [path for item in document for path in host_paths(item)]
    if not isinstance(document, dict):
        return []
    found: list[str] = []
    for key, value in document.items():
        if key == "mounts":
            found += [mount["hostPath"] for mount in value]
        elif key == "deviceNodes":
            found += [node.get("hostPath", node["path"]) for node in value]
        else:
            found += host_paths(value)
    return found


async def test_cdi_specs_name_the_driver_root_as_the_host_sees_it_not_as_the_agent_does(
    agent_dirs: AgentDirs,
    kubeconfig: Path,
    apiserver: ApiServer,
    claims_api: client.ResourceV1Api,
    mock_node: MockNode,
) -> None:
    """In its pod the agent sees the driver root at /driver-root; the container runtime resolves
    the specs' host paths on the host, where that directory is not."""
    seen = make_driver_root(agent_dirs.root / "container-view", DEFAULT_DRIVER_VERSION)
    (seen / "dev").mkdir()  # the driver container's /dev: device nodes are below the root too
    host = "/some/host/path"
    whole = allocate(claims_api, "whole", {"gpu": "gpu-6"}, pool=NODE_NAME)
    dynamic = allocate(claims_api, "dynamic", {"mig": "gpu-2-mig-1g10gb-3"}, pool=NODE_NAME)
    claims = [ClaimArg("default", "whole", whole), ClaimArg("default", "dynamic", dynamic)]
    agent = agent_on_mock(agent_dirs, kubeconfig, mock_node, seen, host_driver_root=host)
    try:
        prepared = (await kubelet_client.prepare(agent_dirs.dra_socket, "v1", claims))["claims"]
        assert {uid: answer["error"] for uid, answer in prepared.items()} == {whole: "", dynamic: ""}
        specs = [json.loads(path.read_text()) for path in sorted(agent_dirs.cdi_dir.glob("*.json"))]
        await kubelet_client.unprepare(agent_dirs.dra_socket, "v1", claims)
    finally:
        agent.terminate()

    paths = host_paths(specs)
    assert f"{host}/{LIBRARY_DIR}/libnvidia-ml.so.{DEFAULT_DRIVER_VERSION}" in paths
    assert f"{host}/dev/nvidiactl" in paths
    assert f"{host}/dev/nvidia6" in paths
    assert f"{host}/dev/nvidia-caps/nvidia-cap1528" in paths
    # The device metadata files are the one mount from elsewhere: the state directory, which the
    # chart mounts at the same path in the agent's pod as on the host.
    metadata = f"{agent_dirs.state_dir}/dra-device-metadata/"
    assert len([path for path in paths if path.startswith(metadata)]) == 2
    assert [path for path in paths if not path.startswith((f"{host}/", metadata))] == []
    assert str(seen) not in json.dumps(specs)


def test_a_driver_only_the_roots_loader_cache_names_is_mounted_where_container_loaders_look(
    agent_dirs: AgentDirs, kubeconfig: Path, mock_node: MockNode
) -> None:
    """A GPU cloud image's layout: the driver in /usr/local/nvidia/lib64, which the root's
    ld.so.conf names, its programs in /usr/local/nvidia/bin."""
    root = make_driver_root(
        agent_dirs.root / "driver",
        DEFAULT_DRIVER_VERSION,
        library_dir="usr/local/nvidia/lib64",
        program_dir="usr/local/nvidia/bin",
    )
    write_loader_cache(root, ("/usr/local/nvidia/lib64",))
    agent = agent_on_mock(agent_dirs, kubeconfig, mock_node, root)
    try:
        found = agent.wait_for_log("driver files found")
        agent.wait_for_log("resourceslices published")
    finally:
        agent.terminate()
    specs = [json.loads(path.read_text()) for path in agent_dirs.cdi_dir.glob("*.json")]
    mounts = {
        mount["containerPath"]: mount["hostPath"]
        for spec in specs
        for device in spec["devices"]
        for mount in device["containerEdits"].get("mounts", [])
    }

    assert found["library_dirs"][0] == "/usr/local/nvidia/lib64"
    assert found["binary_dirs"][0] == "/usr/local/nvidia/bin"
    library = f"{root}/usr/local/nvidia/lib64/libnvidia-ml.so.{DEFAULT_DRIVER_VERSION}"
    # Debian's multiarch directory of this machine (x86_64-linux-gnu, aarch64-linux-gnu).
    assert mounts[f"/usr/lib/{platform.machine()}-linux-gnu/libnvidia-ml.so.1"] == library
    assert mounts["/usr/lib64/libnvidia-ml.so.1"] == library
    assert mounts["/usr/bin/nvidia-smi"] == f"{root}/usr/local/nvidia/bin/nvidia-smi"
    assert not [path for path in mounts if path.startswith("/usr/local")]


async def test_a_sigkill_after_nvml_created_an_instance_leaves_the_mock_whole(
    agent_dirs: AgentDirs,
    kubeconfig: Path,
    apiserver: ApiServer,
    claims_api: client.ResourceV1Api,
    mock_node: MockNode,
) -> None:
    driver_root = make_driver_root(agent_dirs.root / "driver", DEFAULT_DRIVER_VERSION)
    dynamic = allocate(claims_api, "dynamic", {"mig": "gpu-3-mig-3g40gb-4"}, pool=NODE_NAME)
    claim = [ClaimArg("default", "dynamic", dynamic)]
    doomed = agent_on_mock(
        agent_dirs, kubeconfig, mock_node, driver_root, env={"DRA_DRIVER_FAILPOINTS": "prepare.mig-created"}
    )
    with pytest.raises(KubeletClientError):
        await kubelet_client.prepare(agent_dirs.dra_socket, "v1", claim)
    assert doomed.process.wait(30) == -signal.SIGKILL
    assert [line for line in mig_state(mock_node) if line.startswith("gi 3 ")] == ["gi 3 1 9 4 4"]

    agent = agent_on_mock(agent_dirs, kubeconfig, mock_node, driver_root)
    try:
        prepared = (await kubelet_client.prepare(agent_dirs.dra_socket, "v1", claim))["claims"]
        assert prepared[dynamic]["error"] == ""
        assert [line for line in mig_state(mock_node) if line.startswith("gi 3 ")] == ["gi 3 1 9 4 4"]
        unprepared = (await kubelet_client.unprepare(agent_dirs.dra_socket, "v1", claim))["claims"]
        assert unprepared == {dynamic: {"error": ""}}
        assert not any(line.startswith("gi 3 ") for line in mig_state(mock_node))
    finally:
        agent.terminate()


def test_an_xid_from_nvml_taints_its_gpu(
    nvml_agent: AgentProcess, apiserver: ApiServer, mock_node: MockNode
) -> None:
    assert taints(apiserver) == {}

    mock_node.xid(6, 48)

    wait_until(lambda: bool(taints(apiserver)), timeout=10)
    assert taints(apiserver) == {"gpu-6": [(f"{DRIVER}/xid", "48", "NoExecute")]}


@WITHOUT_HOST_NVML
def test_the_agent_waits_for_the_driver_and_starts_once_it_appears(
    agent_dirs: AgentDirs, kubeconfig: Path, apiserver: ApiServer, mock_node: MockNode
) -> None:
    driver_root = agent_dirs.root / "driver"
    driver_root.mkdir(parents=True)
    agent = agent_on_mock(agent_dirs, kubeconfig, mock_node, driver_root, wait=False, more=("-v",))
    try:
        wait_until(lambda: any(e.startswith(WAITING) for e in agent.log_events()), timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port()}/healthz", timeout=5) as answer:
            assert answer.status == 200
        # Two more looks, logged at debug level only.
        wait_until(lambda: agent.log_events().count(LOOKED_AGAIN) >= 2, timeout=30)
        assert agent.process.poll() is None

        make_driver_root(driver_root, DEFAULT_DRIVER_VERSION)

        agent.wait_for_log("node agent running", timeout=30)
        agent.wait_for_log("resourceslices published")
    finally:
        agent.terminate()
    waiting = [line for line in agent.log_lines() if str(line.get("event")).startswith(WAITING)]
    assert len(waiting) == 1
    assert {line["level"] for line in agent.log_lines() if line.get("event") == LOOKED_AGAIN} == {"debug"}
    assert waiting[0]["event"].startswith(
        f"{WAITING}: libnvidia-ml.so.1 cannot be loaded from driver root {driver_root}; looking again"
    )
    assert f"{driver_root}/{LIBRARY_DIR}/libnvidia-ml.so.1 (absent)" in waiting[0]["tried"]
    assert "the NVIDIA driver has appeared; starting" in agent.log_events()


@WITHOUT_HOST_NVML
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_for_the_driver_stops_the_agent_at_once(
    agent_dirs: AgentDirs, kubeconfig: Path, apiserver: ApiServer, mock_node: MockNode, sig: signal.Signals
) -> None:
    """A wrong --driver-root, or the GPU Operator's driver not started yet: the agent waits, and
    a signal meanwhile ends it as a signal to a running agent does, not at kubelet's SIGKILL."""
    driver_root = agent_dirs.root / "driver"
    driver_root.mkdir(parents=True)
    agent = agent_on_mock(agent_dirs, kubeconfig, mock_node, driver_root, wait=False, more=("-v",))
    try:
        wait_until(lambda: any(e.startswith(WAITING) for e in agent.log_events()), timeout=30)
        agent.wait_for_log("observability endpoint listening")
        # Past the first retry: the wait is asleep between looks (it logs a look, then sleeps 2 s).
        agent.wait_for_log(LOOKED_AGAIN, timeout=30)
        sent = time.monotonic()
        agent.process.send_signal(sig)
        try:
            code: int | None = agent.process.wait(3)
        except subprocess.TimeoutExpired:
            code = None  # still waiting for the driver
        took = time.monotonic() - sent
    finally:
        agent.terminate(signal.SIGKILL)
    assert (code, took < 1.0) == (0, True), f"exit {code} after {took:.2f} s"
    stopped = agent.wait_for_log("stopped while waiting for the NVIDIA driver", timeout=1)
    assert stopped["signal"] == sig.name
    assert [e for e in agent.log_events() if "Traceback" in e or "error" in e.lower()] == []
    assert "node agent running" not in agent.log_events()
