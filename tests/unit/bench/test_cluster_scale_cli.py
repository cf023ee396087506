"""The cluster benchmark's command line refuses bad input before it starts anything, and the
harness's checks of the machine."""

import socket
from pathlib import Path

import pytest
import yaml

from tests.bench.cluster_scale import __main__ as bench
from tests.bench.cluster_scale.harness import _listening
from tests.bench.cluster_scale.kwok_stages import stages_yaml


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fleets", "whole,dgx"], "--fleets: expected a comma-separated list of whole"),
        (["--orders", ""], "--orders: expected a comma-separated list of binpack, spread"),
        (["--nodes", "0"], "--nodes: expected 1 to 999, got 0"),
        (["--cost-nodes", "100,x"], "--cost-nodes: expected comma-separated node counts"),
        (["--cost-nodes", "1000"], "--cost-nodes: expected node counts from 1 to 999"),
        (["--kubernetes", "1.20"], "1.20"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_bad_trace_file_exits_2_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text("arrivals:\n  - {at: 0, pod: gpu:9, duration: 10}\n")
    assert bench.main(["--trace", str(trace)]) == 2
    assert "arrivals[0].pod" in capsys.readouterr().err
    assert bench.main(["--trace", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_a_listening_port_is_found_in_the_kernels_table() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not _listening(port)
        server.listen()
        assert _listening(port)


def test_kwok_is_told_to_make_nodes_ready_pods_running_and_deleted_pods_gone() -> None:
    stages = {stage["metadata"]["name"]: stage["spec"] for stage in yaml.safe_load_all(stages_yaml())}
    assert set(stages) == {"node-ready", "pod-running", "pod-delete"}
    assert "type: Ready" in stages["node-ready"]["next"]["statusTemplate"]
    assert "phase: Running" in stages["pod-running"]["next"]["statusTemplate"]
    assert stages["pod-delete"]["next"] == {"delete": True}
    assert {e["key"] for e in stages["pod-running"]["selector"]["matchExpressions"]} >= {".spec.nodeName"}
