"""A running agent (a real process) with named node configs, against the stand-in API server:
the Node's label picks the config, a label change or a changed file is published without a
restart, a config that does not fit a GPU leaves that GPU out with a Warning Event and a metric
while the agent serves on, and a GPU whose plan changes while a claim uses it waits for the claim."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate
from tests.support.node_configs import kinds_by_gpu, write_configmap
from tests.support.nodes import simulated_node
from tests.support.publishing import add_node, json_request, published_specs
from tests.support.waiting import wait_until

LABEL = "dra-driver.dev/config"
MIXED = simulated_node("mixed", NODE_NAME)
# Mode auto on the mixed node: the MIG instances of GPUs 0 and 1, GPUs 2 and 3 (MIG on, no
# instances) nothing, the rest whole.
AUTO = {0: {"mig"}, 1: {"mig"}, 4: {"gpu"}, 5: {"gpu"}, 6: {"gpu"}, 7: {"gpu"}}
SHARED_L4 = "default: {mode: auto}\ngpus: [{model: L4, mode: vgpu-capacity}]\n"
PARTITIONED_L4 = (
    "default: {mode: auto}\ngpus: [{model: L4, mode: vgpu-partitions, vgpu: {partitions: [{memory: 6Gi}]}}]\n"
)
# Seconds within which a change must be published: the file poll (3 s) and a sync.
CHANGE_SECONDS = 10.0


def set_label(server: ApiServer, value: str | None) -> None:
    (stored,) = (obj for obj in server.objects("nodes") if obj["metadata"]["name"] == NODE_NAME)
    labels = stored["metadata"].setdefault("labels", {})
    if value is None:
        labels.pop(LABEL, None)
    else:
        labels[LABEL] = value
    json_request("PUT", f"{server.url}/api/v1/nodes/{NODE_NAME}", stored)


def kinds(server: ApiServer) -> dict[int, set[str]]:
    return kinds_by_gpu(published_specs(server))


def publishes(server: ApiServer, wanted: dict[int, set[str]]) -> None:
    try:
        wait_until(lambda: kinds(server) == wanted, timeout=CHANGE_SECONDS)
    except AssertionError:
        raise AssertionError(f"published {kinds(server)}, wanted {wanted}") from None


def events(server: ApiServer, reason: str) -> list[dict[str, Any]]:
    return [event for event in server.objects("events") if event["reason"] == reason]


def problem_metrics(agent: AgentProcess) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["gpu"], sample.labels["setting"]): sample.value
        for family in text_string_to_metric_families(agent.metrics_text())
        for sample in family.samples
        if sample.name == "dra_driver_node_config_problems"
    }


async def prepare(agent: AgentProcess, claim: ClaimArg) -> dict[str, Any]:
    answer: dict[str, Any] = await kubelet_client.prepare(agent.dirs.dra_socket, "v1", [claim])
    return answer["claims"][claim.uid]  # type: ignore[no-any-return]


async def unprepare(agent: AgentProcess, claim: ClaimArg) -> dict[str, Any]:
    answer: dict[str, Any] = await kubelet_client.unprepare(agent.dirs.dra_socket, "v1", [claim])
    return answer["claims"][claim.uid]  # type: ignore[no-any-return]


@pytest.fixture
def configs(short_dir: Path) -> Path:
    return short_dir / "configs"


def start(agent_dirs: AgentDirs, kubeconfig: Path, configs: Path) -> AgentProcess:
    return start_agent(agent_dirs, kubeconfig, "simulated:mixed", ("--node-configs", str(configs)))


def test_a_label_change_and_a_changed_file_are_published_without_a_restart(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path, configs: Path
) -> None:
    write_configmap(configs, {"default.yaml": "default: {mode: auto}\n", "l4.yaml": SHARED_L4})
    agent = start(agent_dirs, kubeconfig, configs)
    try:
        publishes(apiserver, AUTO)
        set_label(apiserver, "l4")
        publishes(apiserver, {**AUTO, 6: {"vgpu"}, 7: {"vgpu"}})
        write_configmap(configs, {"default.yaml": "default: {mode: auto}\n", "l4.yaml": PARTITIONED_L4})
        publishes(apiserver, {**AUTO, 6: {"gpu", "vgpu"}, 7: {"gpu", "vgpu"}})
        set_label(apiserver, None)
        publishes(apiserver, AUTO)
        assert agent.process.poll() is None
        # Once when the label was first read, then for each change.
        assert agent.log_events().count("node config applied") == 4
    finally:
        assert agent.terminate() == 0


async def test_a_gpu_the_config_does_not_fit_is_left_out_reported_and_the_agent_serves_on(
    apiserver: ApiServer,
    agent_dirs: AgentDirs,
    kubeconfig: Path,
    configs: Path,
    claims_api: client.ResourceV1Api,
) -> None:
    write_configmap(configs, {"dynamic.yaml": "gpus: [{model: A100-SXM4-80GB, mode: mig-dynamic}]\n"})
    set_label(apiserver, "dynamic")
    agent = start(agent_dirs, kubeconfig, configs)
    try:
        # GPUs 4 and 5 have MIG mode off: left out, the others offered as asked.
        publishes(apiserver, {0: {"mig"}, 1: {"mig"}, 2: {"mig"}, 3: {"mig"}, 6: {"gpu"}, 7: {"gpu"}})
        wait_until(lambda: len(events(apiserver, "NodeConfigDoesNotFit")) == 2)
        misfits = sorted(events(apiserver, "NodeConfigDoesNotFit"), key=lambda event: event["message"])
        for event, gpu in zip(misfits, MIXED[4:6], strict=True):
            assert (event["type"], event["involvedObject"]["name"]) == ("Warning", NODE_NAME)
            assert event["message"].startswith(f"node {NODE_NAME}: node config {configs}/dynamic.yaml: ")
            assert (
                f"gpus[0].mode: mig-dynamic on GPU {gpu.index} (NVIDIA A100-SXM4-80GB, {gpu.uuid})"
                in (event["message"])
            )
        assert problem_metrics(agent) == {("4", "gpus[0].mode"): 1.0, ("5", "gpus[0].mode"): 1.0}

        # The agent serves: a claim on a GPU that fits is prepared.
        uid = allocate(claims_api, "on-l4", {"gpu": "gpu-6"}, pool=NODE_NAME)
        claim = ClaimArg("default", "on-l4", uid)
        assert (await prepare(agent, claim))["error"] == ""

        # The file turns malformed: nothing is offered from it, the prepared claim stands.
        write_configmap(configs, {"dynamic.yaml": "gpus: [{model: A100, mode: mig-dynamic}]\n"})
        publishes(apiserver, {})
        wait_until(lambda: len(events(apiserver, "NodeConfigInvalid")) == 1)
        (invalid,) = events(apiserver, "NodeConfigInvalid")
        assert (
            f"node config {configs}/dynamic.yaml: gpus[0].model: 'A100' is not a GPU model"
            in (invalid["message"])
        )
        assert problem_metrics(agent) == {("", "gpus[0].model"): 1.0}
        assert agent.process.poll() is None

        # A label naming no file: nothing either, until the file appears.
        set_label(apiserver, "absent")
        wait_until(lambda: len(events(apiserver, "NodeConfigInvalid")) == 2)
        messages = [event["message"] for event in events(apiserver, "NodeConfigInvalid")]
        assert any("names config 'absent', but there is no" in message for message in messages)
        write_configmap(configs, {"dynamic.yaml": "{}\n", "absent.yaml": "default: {mode: auto}\n"})
        publishes(apiserver, AUTO)
        assert problem_metrics(agent) == {}
        assert (await unprepare(agent, claim))["error"] == ""
    finally:
        assert agent.terminate() == 0


async def test_a_gpu_whose_mode_changes_under_a_prepared_claim_waits_for_the_claim(
    apiserver: ApiServer,
    agent_dirs: AgentDirs,
    kubeconfig: Path,
    configs: Path,
    claims_api: client.ResourceV1Api,
) -> None:
    """Re-planning GPU 6 from whole to shared while a claim holds it whole would let the
    scheduler hand out shares of a GPU already given away: it offers nothing until the claim goes."""
    write_configmap(configs, {"default.yaml": "default: {mode: auto}\n", "l4.yaml": SHARED_L4})
    agent = start(agent_dirs, kubeconfig, configs)
    try:
        publishes(apiserver, AUTO)
        uid = allocate(claims_api, "whole", {"gpu": "gpu-6"}, pool=NODE_NAME)
        claim = ClaimArg("default", "whole", uid)
        assert (await prepare(agent, claim))["error"] == ""

        # A restarted agent cannot know the plan the claim was prepared under: it offers the GPU
        # as the config says, without waiting.
        assert agent.terminate() == 0
        agent = start(agent_dirs, kubeconfig, configs)
        agent.wait_for_log("node config applied")
        publishes(apiserver, AUTO)

        set_label(apiserver, "l4")
        publishes(apiserver, {0: {"mig"}, 1: {"mig"}, 4: {"gpu"}, 5: {"gpu"}, 7: {"vgpu"}})
        agent.wait_for_log(
            "GPU offers nothing until the claims that use it are unprepared; then its new config applies"
        )
        assert (await unprepare(agent, claim))["error"] == ""
        publishes(apiserver, {**AUTO, 6: {"vgpu"}, 7: {"vgpu"}})
    finally:
        assert agent.terminate() == 0


def test_a_single_node_config_file_that_does_not_fit_a_gpu_leaves_only_that_gpu_out(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path, short_dir: Path
) -> None:
    """--node-config FILE: the same as a named config, checked once at start."""
    node_config = short_dir / "node.yaml"
    node_config.write_text("gpus: [{index: 1, mode: mig-dynamic}]\n")
    agent = start_agent(agent_dirs, kubeconfig, "simulated:l4x8", ("--node-config", str(node_config)))
    try:
        publishes(apiserver, {index: {"gpu"} for index in range(8) if index != 1})
        wait_until(lambda: len(events(apiserver, "NodeConfigDoesNotFit")) == 1)
        (event,) = events(apiserver, "NodeConfigDoesNotFit")
        gpu = simulated_node("l4x8", NODE_NAME)[1]
        assert event["message"] == (
            f"node {NODE_NAME}: node config {node_config}: gpus[0].mode: mig-dynamic on GPU 1 (NVIDIA L4, "
            f"{gpu.uuid}): this GPU does not support MIG; GPU 1 is left out (offers no devices) until its "
            "config fits"
        )
        assert problem_metrics(agent) == {("1", "gpus[0].mode"): 1.0}
    finally:
        assert agent.terminate() == 0


def test_a_faulty_gpu_keeps_its_taints_when_the_config_changes(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path, configs: Path
) -> None:
    write_configmap(configs, {"default.yaml": "default: {mode: auto}\n", "l4.yaml": SHARED_L4})
    agent = start(agent_dirs, kubeconfig, configs)
    try:
        publishes(apiserver, AUTO)
        fault = ("simulate-fault", "--state-dir", str(agent_dirs.state_dir), "--gpu", "6", "--lost")
        subprocess.run(
            [sys.executable, "-m", "dra_driver", *fault],
            check=True,
            capture_output=True,
            timeout=30,
        )
        wait_until(lambda: tainted(apiserver) == {"gpu-6"})
        set_label(apiserver, "l4")
        publishes(apiserver, {**AUTO, 6: {"vgpu"}, 7: {"vgpu"}})
        # GPU 6's new device (a shareable one, still named gpu-6) carries the lost GPU's taint.
        assert tainted(apiserver) == {"gpu-6"}
    finally:
        assert agent.terminate() == 0


def tainted(server: ApiServer) -> set[str]:
    return {
        device["name"]
        for spec in published_specs(server)
        for device in spec.get("devices") or []
        if device.get("taints")
    }


# Six XIDs that each count (fatal or degraded): more than Kubernetes 1.34 allows on one device.
MANY_XIDS = ("46", "48", "62", "79", "64", "74")


def test_a_fallback_on_kubernetes_1_34_keeps_a_faulty_gpu_within_its_four_taints(
    agent_dirs: AgentDirs, short_dir: Path, configs: Path
) -> None:
    """The server drops consumable capacity (the gate is off) only once the label asks for shared
    L4s; the re-planned inventory must still be tainted for 1.34, not for 1.35."""
    server = ApiServer("1.34", disabled_features={"DRAConsumableCapacity"}).start()
    try:
        add_node(server)
        kubeconfig = server.write_kubeconfig(short_dir / "kubeconfig-1.34")
        write_configmap(configs, {"default.yaml": "default: {mode: auto}\n", "l4.yaml": SHARED_L4})
        agent = start(agent_dirs, kubeconfig, configs)
        try:
            publishes(server, AUTO)
            for xid in MANY_XIDS:
                fault = ("simulate-fault", "--state-dir", str(agent_dirs.state_dir), "--gpu", "6")
                subprocess.run(
                    [sys.executable, "-m", "dra_driver", *fault, "--xid", xid],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
            wait_until(lambda: agent.log_events().count("device health changed") == len(MANY_XIDS))
            wait_until(lambda: taint_counts(server) == {"gpu-6": 4})
            set_label(server, "l4")
            agent.wait_for_log(FALLBACK, CHANGE_SECONDS)
            wait_until(lambda: replan_published(agent), timeout=CHANGE_SECONDS)
            counts = taint_counts(server)
            assert counts and set(counts.values()) == {4}, counts
            assert "resourceslice sync failed; retrying" not in agent.log_events()
            assert agent.process.poll() is None
        finally:
            assert agent.terminate() == 0
    finally:
        server.stop()


FALLBACK = "GPU offered differently: the cluster cannot use a feature"


def replan_published(agent: AgentProcess) -> bool:
    """Whether the inventory re-planned at the last fallback has been written: a publish after it
    of a newer generation than any before it (a sync under way at the fallback writes the old one)."""
    lines = agent.log_lines()
    at = max(i for i, line in enumerate(lines) if line.get("event") == FALLBACK)
    generations = [
        (i > at, line["generation"])
        for i, line in enumerate(lines)
        if line.get("event") == "resourceslices published"
    ]
    before = max((generation for after, generation in generations if not after), default=0)
    return any(after and generation > before for after, generation in generations)


def taint_counts(server: ApiServer) -> dict[str, int]:
    return {
        device["name"]: len(device["taints"])
        for spec in published_specs(server)
        for device in spec.get("devices") or []
        if device.get("taints")
    }
