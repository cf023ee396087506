"""Per-claim, per-pod GPU usage end to end: the agent on the mock libnvidia-ml.so.1, a stand-in
kubelet PodResources server, processes whose cgroups name their pods, and /metrics scraped as
Prometheus would. Two vGPU shares of one GPU: one over its memory limit (the shipped alert fires
for it and only it), and one whose pod ends (its series go)."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.contract.test_agent_on_mock_nvml import DRIVER, agent_on_mock
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess
from tests.support.claims import allocate_results
from tests.support.mock_nvml import WITHOUT_HOST_NVML, MockNode, make_driver_root
from tests.support.pod_resources import Pod, StandInKubelet, UsedDevice, serve_pod_resources
from tests.support.promql import Labels, firing
from tests.support.waiting import wait_until

pytestmark = WITHOUT_HOST_NVML

RULES = Path(__file__).resolve().parents[2] / "deploy/helm/dra-driver/files/prometheus/dra-driver-rules.yaml"
GIB = 2**30
SHARE_A = "0d6a1c8e-3b2f-4a5d-9c7e-1f2a3b4c5d6e"
SHARE_B = "7e5d4c3b-2a1f-4e9d-8c7b-6a5f4e3d2c1b"
POD_A = "11111111-2222-4333-8444-555555555555"
POD_B = "66666666-7777-4888-9999-aaaaaaaaaaaa"
GPU_4 = 4


def claim_values(samples: dict[tuple[str, Labels], float], name: str) -> dict[str, float]:
    return {dict(labels)["claim"]: value for (metric, labels), value in samples.items() if metric == name}


def share_over_limit_rule() -> str:
    rules = yaml.safe_load(RULES.read_text())
    (expr,) = [
        rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "DRADriverShareOverMemoryLimit"
    ]
    return str(expr)


def fake_process(node: MockNode, pid: int, pod_uid: str) -> None:
    """A process in the pod's container cgroup (systemd driver layout), where --proc-root points."""
    directory = node.proc / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    slice_name = f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice"
    (directory / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/{slice_name}/cri-containerd-{'c' * 64}.scope\n"
    )


@pytest.fixture
def kubelet(agent_dirs: AgentDirs) -> Iterator[StandInKubelet]:
    agent_dirs.root.mkdir(parents=True, exist_ok=True)
    with serve_pod_resources(agent_dirs.root / "pr.sock") as standin:
        yield standin


@pytest.fixture
def usage_agent(
    agent_dirs: AgentDirs, kubeconfig: Path, kubelet: StandInKubelet
) -> Iterator[tuple[AgentProcess, MockNode]]:
    node = MockNode.create(agent_dirs.root / "mock", NODE_NAME, "mixed")
    pod_logs = agent_dirs.root / "pods"
    for uid, pod in ((POD_A, "trainer-a"), (POD_B, "trainer-b")):
        (pod_logs / f"team_{pod}_{uid}" / "main").mkdir(parents=True)
    driver_root = make_driver_root(agent_dirs.root / "driver", DEFAULT_DRIVER_VERSION)
    extra = (
        *("--usage-interval", "0.2", "--pod-resources-socket", str(agent_dirs.root / "pr.sock")),
        *("--usage-processes", "true", "--pod-logs-dir", str(pod_logs)),
    )
    agent = agent_on_mock(agent_dirs, kubeconfig, node, driver_root, more=extra)
    agent.wait_for_log("resourceslices published")
    yield agent, node
    agent.terminate()


async def test_two_vgpu_shares_of_one_gpu_are_measured_against_their_limits_and_a_pod_that_ends_goes(
    usage_agent: tuple[AgentProcess, MockNode], kubelet: StandInKubelet, claims_api: client.ResourceV1Api
) -> None:
    agent, node = usage_agent
    uids = {}
    for name, share, memory, cores in (("a", SHARE_A, "8Gi", "20"), ("b", SHARE_B, "4Gi", "10")):
        result = {
            "request": "v",
            "driver": DRIVER,
            "pool": NODE_NAME,
            "device": "gpu-4",
            "shareID": share,
            "consumedCapacity": {"memory": memory, "cores": cores},
        }
        uids[name] = allocate_results(claims_api, name, [result], namespace="team")
    claims = [ClaimArg("team", name, uid) for name, uid in uids.items()]
    prepared = (await kubelet_client.prepare(agent.dirs.dra_socket, "v1", claims))["claims"]
    assert {answer["error"] for answer in prepared.values()} == {""}

    kubelet.set_pods(
        [
            Pod("team", "trainer-a", [UsedDevice("main", "a", DRIVER, NODE_NAME, "gpu-4", SHARE_A)]),
            Pod("team", "trainer-b", [UsedDevice("main", "b", DRIVER, NODE_NAME, "gpu-4", SHARE_B)]),
        ]
    )
    fake_process(node, 4101, POD_A)
    fake_process(node, 4102, POD_B)
    node.run_processes([(GPU_4, -1, -1, 4101, 10 * GIB), (GPU_4, -1, -1, 4102, GIB)])
    node.set_utilization({GPU_4: 55})
    node.set_process_utilization([(GPU_4, 4101, 40), (GPU_4, 4102, 15)])

    def used() -> dict[str, float]:
        return claim_values(agent.scrape(), "dra_driver_claim_memory_used_bytes")

    wait_until(lambda: used() == {"a": 10 * GIB, "b": GIB}, timeout=15)
    samples = agent.scrape()
    assert claim_values(samples, "dra_driver_claim_memory_limit_bytes") == {"a": 8 * GIB, "b": 4 * GIB}
    assert claim_values(samples, "dra_driver_claim_compute_limit_ratio") == {"a": 0.2, "b": 0.1}
    assert claim_values(samples, "dra_driver_claim_utilization_ratio") == {"a": 0.4, "b": 0.15}
    pods = {
        dict(labels)["claim"]: (dict(labels)["pod"], dict(labels)["container"], dict(labels)["gpu"])
        for (metric, labels) in samples
        if metric == "dra_driver_claim_memory_limit_bytes"
    }
    assert pods == {"a": ("trainer-a", "main", "4"), "b": ("trainer-b", "main", "4")}
    # Every GPU of the node, allocated or not; GPU 4 carries both shares' processes.
    gpus = {
        dict(labels)["gpu"]: value
        for (m, labels), value in samples.items()
        if m == "dra_driver_gpu_memory_used_bytes"
    }
    assert len(gpus) == 8
    assert gpus["4"] == 11 * GIB
    over = firing(share_over_limit_rule(), samples)
    assert [dict(labels)["claim"] for labels in over] == ["a"]

    # Pod b ends: kubelet forgets it and unprepares its claim; its series go.
    kubelet.set_pods(
        [Pod("team", "trainer-a", [UsedDevice("main", "a", DRIVER, NODE_NAME, "gpu-4", SHARE_A)])]
    )
    node.run_processes([(GPU_4, -1, -1, 4101, 10 * GIB)])
    await kubelet_client.unprepare(agent.dirs.dra_socket, "v1", [claims[1]])

    def limits() -> dict[str, float]:
        return claim_values(agent.scrape(), "dra_driver_claim_memory_limit_bytes")

    wait_until(lambda: limits() == {"a": 8 * GIB}, timeout=15)
    assert not any(dict(labels).get("claim") == "b" for (_m, labels) in agent.scrape())


def last_sample(agent: AgentProcess) -> float:
    return next(
        (
            v
            for (m, _labels), v in agent.scrape().items()
            if m == "dra_driver_usage_last_sample_timestamp_seconds"
        ),
        0.0,
    )


async def test_a_sampler_stuck_in_nvml_does_not_delay_a_prepare(
    usage_agent: tuple[AgentProcess, MockNode], claims_api: client.ResourceV1Api
) -> None:
    agent, node = usage_agent
    wait_until(lambda: last_sample(agent) > 0, timeout=10)
    stuck = node.hang("nvmlDeviceGetComputeRunningProcesses_v3")
    wait_until(lambda: node.hung("nvmlDeviceGetComputeRunningProcesses_v3"), timeout=10)
    frozen = last_sample(agent)
    await asyncio.sleep(0.6)  # three sampling intervals: what is asserted is that none completes
    assert last_sample(agent) == frozen, "the sampler should be stuck in NVML"

    # A dynamic MIG device: prepare creates its instance through NVML (the backend's own thread).
    uid = allocate_results(
        claims_api,
        "mig",
        [{"request": "m", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-2-mig-1g10gb-3"}],
        namespace="team",
    )
    started = time.monotonic()
    prepared = await kubelet_client.prepare(agent.dirs.dra_socket, "v1", [ClaimArg("team", "mig", uid)])
    took = time.monotonic() - started
    assert prepared["claims"][uid]["error"] == ""
    assert took < 5, f"prepare took {took:.1f} s while the sampler was stuck"
    assert last_sample(agent) == frozen

    stuck.unlink()
    wait_until(lambda: last_sample(agent) > frozen, timeout=10)


def test_without_kubelets_socket_a_sample_still_reports_claims_and_counts_the_failure(tmp_path: Path) -> None:
    """In process: the simulated reader, a claim record, and a PodResources socket nobody serves."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from dra_driver.claims.identity import claim_ref  # noqa: PLC0415
    from dra_driver.claims.records import ClaimRecord, PreparedDevice  # noqa: PLC0415
    from dra_driver.devices.inventory import node_inventory  # noqa: PLC0415
    from dra_driver.devices.node_config_decode import parse_node_config  # noqa: PLC0415
    from dra_driver.hardware.simulated_usage import SimulatedUsageReader  # noqa: PLC0415
    from dra_driver.observability.usage_metrics import UsageMetrics  # noqa: PLC0415
    from dra_driver.usage.facts import device_facts  # noqa: PLC0415
    from dra_driver.usage.pod_resources import PodResourcesClient  # noqa: PLC0415
    from dra_driver.usage.sampler import UsageSources, sample  # noqa: PLC0415
    from tests.support.nodes import simulated_node  # noqa: PLC0415

    gpus = simulated_node("dgx-h100")
    facts = device_facts(node_inventory(gpus, parse_node_config({}, "t")))
    record = ClaimRecord(
        claim=claim_ref("team", "solo", "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"),
        devices=(PreparedDevice(("r",), NODE_NAME, "gpu-0", ("k8s.x/claim=solo",)),),
    )
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry)
    sources = UsageSources(
        reader=SimulatedUsageReader(lambda: gpus, None),
        driver_name=DRIVER,
        claims=lambda: [record],
        facts=lambda: facts,
        gpus=lambda: gpus,
        pod_resources=PodResourcesClient(tmp_path / "nobody.sock", timeout=0.5),
    )
    report = sample(sources, metrics)
    assert [(row.claim, row.pod, row.memory_used_bytes) for row in report.claims] == [("solo", "", 0)]
    assert len(report.gpus) == 8
    errors = registry.get_sample_value("dra_driver_usage_sample_errors_total", {"source": "podresources"})
    assert errors == 1.0
