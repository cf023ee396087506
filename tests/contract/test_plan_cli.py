"""`dra-driver plan`: the table and JSON say what the planner says, the drawing is written, and a
live node is planned on the slices the stand-in API server stores, read through the official
client."""

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver.cli import main
from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.packing.allocator import Allocation, DeviceResult, Pool
from dra_driver.packing.planner import plan_node_config, plan_node_modes, plan_pool
from dra_driver.packing.shapes import parse_pods
from dra_driver.tools.plan_report import plan_document
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate
from tests.support.nodes import simulated_node
from tests.support.publishing import DRIVER, json_request

PODS = "10x1g.10gb,4xvgpu:10Gi/30%,2xgpu"


def test_json_is_the_planners_answer_for_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["plan", "--node", "simulated:dgx-h100", "--node-name", "node-a", "--pods", PODS, "-o", "json"]
    )

    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    groups = parse_pods(PODS)
    plans = plan_node_modes(simulated_node("dgx-h100", "node-a"), groups, DRIVER)
    assert printed == plan_document(printed["node"], groups, plans)
    assert [mode["mode"] for mode in printed["modes"]] == [
        "gpu",
        "mig-dynamic",
        "vgpu-capacity",
        "vgpu-partitions",
    ]


def test_the_table_says_per_mode_how_many_fit_and_per_gpu_what_is_stranded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["plan", "--node", "simulated:dgx-h100", "--pods", PODS, "--mode", "mig-dynamic"])

    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    (plan,) = plan_node_modes(simulated_node("dgx-h100", "node"), parse_pods(PODS), DRIVER, ("mig-dynamic",))
    assert lines[0] == "node: simulated profile dgx-h100: 8x NVIDIA H100 80GB HBM3"
    assert lines[3].startswith(f"mode mig-dynamic: {plan.placed} of {plan.asked} pods fit")
    gpu_header = next(n for n, line in enumerate(lines) if line.split()[:2] == ["GPU", "OFFERED"])
    gpu_rows = [line.split() for line in lines[gpu_header + 1 : gpu_header + 1 + len(plan.gpus)]]
    assert [row[0] for row in gpu_rows] == [str(gpu.layout.index) for gpu in plan.gpus]
    assert [row[4] for row in gpu_rows] == [f"{gpu.stranded_bytes / 2**30:.1f}Gi" for gpu in plan.gpus]


@pytest.mark.parametrize("output", ["svg", "png"])
def test_a_drawing_is_written_to_the_output_file(output: str, tmp_path: Path) -> None:
    target = tmp_path / f"node.{output}"
    # A node file of its own and one mode: two panels draw in a fraction of the time of dozens.
    node = tmp_path / "node.yaml"
    node.write_text("gpus: [{model: L4, count: 2}]\n")
    pods = ["--pods", "3xvgpu:4Gi", "--mode", "vgpu-capacity"]

    code = main(["plan", "--node", f"simulated:{node}", *pods, "-o", output, "--output-file", str(target)])

    assert code == 0
    assert target.stat().st_size > 1000


def published_mig_node(apiserver: ApiServer) -> Inventory:
    """node-a, a dgx-h100-mig in MIG dynamic mode, with its slices stored as its agent writes them."""
    inventory = node_inventory(
        simulated_node("dgx-h100-mig", "node-a"), NodeConfig(GpuSettings(mode="mig-dynamic"))
    )
    for body in slices_to_api(plan_slices(inventory, "1.35"), DRIVER, "node-a"):
        json_request("POST", f"{apiserver.url}/apis/resource.k8s.io/v1/resourceslices", body)
    return inventory


def planned_live(kubeconfig: Path, pods: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The one mode `dra-driver plan -o json` prints for live node-a: its published devices."""
    args = ["--kubeconfig", str(kubeconfig), "--node-name", "node-a", "--pods", pods, "-o", "json"]
    code = main(["plan", *args])
    assert code == 0, capsys.readouterr().err
    (printed,) = json.loads(capsys.readouterr().out)["modes"]
    assert isinstance(printed, dict)
    return printed


def test_a_live_node_is_planned_on_its_published_slices(
    apiserver: ApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = published_mig_node(apiserver)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")

    printed = planned_live(kubeconfig, "9x1g.10gb,3g.40gb", capsys)
    expected = plan_pool(Pool.from_inventory(inventory, DRIVER), parse_pods("9x1g.10gb,3g.40gb"), "published")
    assert printed["mode"] == "published"
    assert [[p["device"] for p in group["placements"]] for group in printed["groups"]] == [
        [pod.device for pod in outcome.placed] for outcome in expected.groups
    ]
    assert printed["fit"] == 10


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        ({"dra-driver.dev/config": "a100-mig"}, "config 'a100-mig' (label dra-driver.dev/config=a100-mig)"),
        ({}, "the default config (no label dra-driver.dev/config)"),
        (None, "no Node node-a, so no config label"),
        (
            {"forbidden": "403"},
            "config unknown: LIST nodes: API server answered 403: injected fault",
        ),
    ],
)
def test_a_live_node_is_planned_as_its_chosen_config_offers_it_and_says_which(
    labels: dict[str, str] | None,
    said: str,
    apiserver: ApiServer,
    kubeconfig: Path,
    claims_api: client.ResourceV1Api,
    capsys: pytest.CaptureFixture[str],
) -> None:
    published_mig_node(apiserver)
    nodes = client.CoreV1Api(claims_api.api_client)
    if labels is None:
        nodes.delete_node("node-a")
    elif "forbidden" in labels:
        apiserver.faults.fail_next, apiserver.faults.fail_status = 1, 403
    else:
        node = nodes.read_node("node-a")
        node.metadata.labels = labels
        nodes.replace_node("node-a", node)

    args = ["--kubeconfig", str(kubeconfig), "--node-name", "node-a", "--pods", "gpu", "-o", "json"]
    assert main(["plan", *args]) == 0

    assert json.loads(capsys.readouterr().out)["node"] == f"node node-a (published ResourceSlices; {said})"


def test_a_live_node_without_slices_is_a_failure_not_bad_input(
    apiserver: ApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")

    code = main(["plan", "--kubeconfig", str(kubeconfig), "--node-name", "node-z", "--pods", "gpu"])

    assert code == 1
    assert (
        capsys.readouterr().err == "dra-driver plan: node node-z publishes no devices of gpu.dra-driver.dev\n"
    )


def test_a_live_node_is_planned_around_the_devices_its_claims_hold(
    apiserver: ApiServer,
    kubeconfig: Path,
    claims_api: client.ResourceV1Api,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inventory = published_mig_node(apiserver)
    allocate(claims_api, "held", {"big": "gpu-0-mig-3g40gb-0"}, pool="node-a")
    allocate(claims_api, "elsewhere", {"big": "gpu-0-mig-3g40gb-0"}, pool="node-b")

    printed = planned_live(kubeconfig, "9x1g.10gb", capsys)
    held = Allocation((DeviceResult("big", "gpu-0-mig-3g40gb-0"),))
    expected = plan_pool(
        Pool.from_inventory(inventory, DRIVER),
        parse_pods("9x1g.10gb"),
        "published",
        allocated=[(held, "claim")],
    )
    (group,) = printed["groups"]
    placements = [placement["device"] for placement in group["placements"]]
    assert placements == [pod.device for pod in expected.groups[0].placed]
    # The held 3g instance covers GPU 0's slices 0-3: the 1g pods start after it.
    on_gpu_0 = [int(device.rsplit("-", 1)[1]) for device in placements if device.startswith("gpu-0-")]
    assert on_gpu_0 and min(on_gpu_0) >= 4
    assert printed["gpus"][0]["usedBytes"] > 0


def test_the_answer_goes_to_the_output_file_and_an_unwritable_one_is_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--node", "simulated:l4x8", "--pods", "2xgpu", "--mode", "gpu", "-o", "json"]

    assert main([*args, "--output-file", str(tmp_path / "plan.json")]) == 0
    assert main(args) == 0
    assert (tmp_path / "plan.json").read_text() == capsys.readouterr().out
    assert main([*args, "--output-file", str(tmp_path / "absent" / "plan.json")]) == 1
    assert capsys.readouterr().err.startswith(f"dra-driver plan: --output-file {tmp_path}/absent/plan.json: ")


def test_a_node_config_file_is_planned_as_the_agent_reads_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config_file = Path("deploy/examples/node-configs/mixed-fleet.yaml")
    pods = "2x3g.40gb,2xvgpu:6Gi,8xgpu"

    code = main(
        ["plan", "--node", "simulated:mixed", "--node-config", str(config_file), "--pods", pods, "-o", "json"]
    )

    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    groups = parse_pods(pods)
    plan = plan_node_config(simulated_node("mixed", "node"), groups, DRIVER, load_node_config(config_file))
    assert printed == plan_document(printed["node"], groups, (plan,))
    assert printed["node"].endswith(f"; node config {config_file}")
    assert [mode["mode"] for mode in printed["modes"]] == ["node-config"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--node-config", "{config}", "--mode", "gpu"], "--mode: not with --node-config"),
        (["--node-config", "{missing}"], "--node-config: node config {missing}"),
        (["--node-config", "{bad}"], "--node-config: node config {bad}: default.mode"),
    ],
)
def test_a_node_config_that_cannot_work_is_invalid_input_naming_the_flag(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {
        "config": tmp_path / "ok.yaml",
        "missing": tmp_path / "missing.yaml",
        "bad": tmp_path / "bad.yaml",
    }
    names["config"].write_text("default: {mode: gpu}\n")
    names["bad"].write_text("default: {mode: whole}\n")
    args = [part.format(**names) for part in extra]

    code = main(["plan", "--node", "simulated:l4x8", "--pods", "gpu", *args])

    assert code == 2
    assert capsys.readouterr().err.startswith(f"dra-driver plan: {message.format(**names)}")


def test_mig_static_is_a_mode_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["plan", "--node", "simulated:mixed", "--pods", "2x1g.10gb", "--mode", "mig-static", "-o", "json"]
    )

    assert code == 0
    (mode,) = json.loads(capsys.readouterr().out)["modes"]
    assert mode["mode"] == "mig-static"
    assert [pod["gpu"] for pod in mode["groups"][0]["placements"]] == [0, 0]
