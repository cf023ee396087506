"""`dra-driver plan --trace`: a trace file replayed with the static and the live order side by
side, as a table, JSON and a drawing; a bad trace or flag exits 2 naming the field."""

import json
from pathlib import Path

import pytest

from dra_driver.cli import main
from dra_driver.packing.planner import mode_inventory
from dra_driver.packing.trace_file import parse_trace
from dra_driver.packing.trace_plan import replay_trace, trace_groups
from dra_driver.tools.trace_report import trace_json
from tests.support.nodes import simulated_node
from tests.support.publishing import DRIVER

# On one H100 the live order refuses the 1g.20gb that binpack admits (tests/unit/packing/test_trace_plan.py).
TRACE = """\
arrivals:
  - {at: 0, pod: 1g.10gb, duration: 3600}
  - {at: 1, pod: 1g.10gb, name: second}
  - {at: 2, pod: 3g.40gb, duration: 3600}
  - {at: 3, pod: 1g.20gb, duration: 3600}
departures:
  - {at: 4000, name: second}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    node = tmp_path / "node.yaml"
    node.write_text("gpus: [{model: H100-SXM5-80GB, count: 1, migMode: enabled}]\n")
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    return node, trace


def _plan(node: Path, *args: str) -> int:
    return main(["plan", "--node", f"simulated:{node}", "--mode", "mig-dynamic", *args])


def test_the_table_puts_the_static_and_live_order_side_by_side(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    node, trace = files
    assert _plan(node, "--trace", str(trace)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"trace: {trace}: 4 pods (2x1g.10gb, 1x3g.40gb, 1x1g.20gb)"
    rows = {line.split("  ")[1].strip(): line for line in lines if line.startswith("  ")}
    assert rows[""].split() == ["static", "order", "live", "order"]
    assert rows["refused"].split()[1:] == ["0", "1"]
    assert rows["refused by kind"].split()[3:] == ["-", "1x1g.20gb"]
    assert rows["slice writes"].split()[2] == "0"


def test_json_is_the_replays_answer(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    node, trace = files
    assert _plan(node, "--node-name", "node-a", "--trace", str(trace), "-o", "json") == 0
    printed = json.loads(capsys.readouterr().out)
    parsed = parse_trace(
        {
            "arrivals": [
                {"at": 0, "pod": "1g.10gb", "duration": 3600},
                {"at": 1, "pod": "1g.10gb", "name": "second"},
                {"at": 2, "pod": "3g.40gb", "duration": 3600},
                {"at": 3, "pod": "1g.20gb", "duration": 3600},
            ],
            "departures": [{"at": 4000, "name": "second"}],
        },
        f"--trace {trace}",
    )
    gpus = simulated_node(f"{node}", "node-a")
    inventory, notes = mode_inventory(gpus, "mig-dynamic", trace_groups(parsed), DRIVER)
    replays = (replay_trace(inventory, DRIVER, parsed, "mig-dynamic", notes),)
    assert printed == json.loads(trace_json(printed["node"], printed["trace"], replays))
    (mode,) = printed["modes"]
    assert (mode["static"]["refused"], mode["live"]["refused"]) == (0, 1)
    assert mode["live"]["allocation_changes"] == 6 and mode["static"]["allocation_changes"] == 8


@pytest.mark.parametrize("output", ["svg", "png"])
def test_the_drawing_has_a_column_per_order(output: str, files: tuple[Path, Path], tmp_path: Path) -> None:
    node, trace = files
    target = tmp_path / f"replay.{output}"
    assert _plan(node, "--trace", str(trace), "-o", output, "--output-file", str(target)) == 0
    assert target.stat().st_size > 1000
    if output == "svg":
        text = target.read_text()
        assert "mig-dynamic, static order: 4 of 4 fit" in text
        assert "mig-dynamic, live order: 3 of 4 fit" in text


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("arrivals: [{at: 0, pod: 1g.10gb}]\n", (), "arrivals[0]: expected exactly one of duration"),
        (
            "arrivals: [{at: 0, pod: 9g.90gb, duration: 1}]\n",
            (),
            'arrivals[0].pod: MIG profile "9g.90gb" is not',
        ),
        ("arrivals: [{at: 0, pod: gpu, duration: 1}]\n", ("--pods", "gpu"), "--pods: give the pods to plan"),
        (
            "arrivals: [{at: 0, pod: gpu, duration: 1}]\n",
            ("-o", "layout"),
            "--output layout: not with --trace",
        ),
        (
            "arrivals: [{at: 0, pod: gpu, duration: 1}]\n",
            ("-o", "svg"),
            "--output-file: required with -o svg",
        ),
        ("arrivals: [\n", (), "--trace "),
    ],
)
def test_a_bad_trace_or_flag_exits_2_naming_it(
    content: str, extra: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus: [{model: H100-SXM5-80GB, count: 1, migMode: enabled}]\n")
    trace = tmp_path / "trace.yaml"
    trace.write_text(content)
    assert _plan(node, "--trace", str(trace), *extra) == 2
    assert message in capsys.readouterr().err


def test_a_trace_is_for_simulated_nodes_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text("arrivals: [{at: 0, pod: gpu, duration: 1}]\n")
    kubeconfig = tmp_path / "kubeconfig"
    code = main(["plan", "--kubeconfig", str(kubeconfig), "--node-name", "n", "--trace", str(trace)])
    assert code == 2
    assert "--node: required with --trace" in capsys.readouterr().err
    assert main(["plan", "--node", "simulated:dgx-h100", "--trace", str(tmp_path / "missing.yaml")]) == 2
    assert f"--trace {tmp_path / 'missing.yaml'}: cannot read it" in capsys.readouterr().err


def test_a_node_config_replays_as_the_agent_would_offer_the_gpus(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, trace = files
    config = tmp_path / "config.yaml"
    config.write_text("default:\n  mode: mig-dynamic\n")
    code = main(
        [
            "plan",
            "--node",
            f"simulated:{node}",
            "--node-config",
            str(config),
            "--trace",
            str(trace),
            "-o",
            "json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    (mode,) = json.loads(capsys.readouterr().out)["modes"]
    assert mode["mode"] == "node-config"
    assert (mode["static"]["refused"], mode["live"]["refused"]) == (0, 1)
