"""`dra-driver validate-config`: refuses what the agent would refuse, with the agent's lines, and
with --hardware plans against a node's GPUs; the fleet example of docs/configuration.md fits the
mixed node."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.cli import main
from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.node_config import NodeConfigError
from tests.support.node_configs import kinds_by_gpu, write_configmap
from tests.support.nodes import simulated_node

REPOSITORY = Path(__file__).resolve().parents[2]
FLEET_EXAMPLE = REPOSITORY / "deploy" / "examples" / "node-configs" / "mixed-fleet.yaml"
PREFIX = "dra-driver validate-config: "


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", *args], check=False, capture_output=True, text=True, timeout=60
    )


def validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], list[str]]:
    code = main(["validate-config", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), [line.removeprefix(PREFIX) for line in err.splitlines()]


def test_the_fleet_example_fits_the_mixed_node_as_validate_config_and_inspect_show() -> None:
    plain = run("validate-config", str(FLEET_EXAMPLE))
    assert plain.returncode == 0, plain.stderr
    planned = run("validate-config", str(FLEET_EXAMPLE), "--hardware", "simulated:mixed", "--node-name", "n")
    assert planned.returncode == 0, planned.stderr
    modes = [line.rsplit(": ", 1)[1] for line in planned.stdout.splitlines() if line.startswith("  GPU ")]
    assert modes == [*["mig-static"] * 4, "gpu", "gpu", "vgpu-partitions", "vgpu-partitions"]

    shown = run("inspect", "--hardware", "simulated:mixed", "--node-config", str(FLEET_EXAMPLE), "-o", "yaml")
    assert shown.returncode == 0, shown.stderr
    specs = [document["spec"] for document in yaml.safe_load_all(shown.stdout)]
    # GPUs 2 and 3 have MIG on and no instances: nothing (a note, not a config problem).
    assert kinds_by_gpu(specs) == {
        0: {"mig"},
        1: {"mig"},
        4: {"gpu"},
        5: {"gpu"},
        6: {"gpu", "vgpu"},
        7: {"gpu", "vgpu"},
    }


def test_every_problem_of_a_file_is_one_line_the_same_as_the_agents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(
        "default: {mode: whole}\ngpus: [{index: 0, mode: gpu}, {model: A100}, {productName: 7}]\n"
    )
    code, out, err = validate(capsys, str(config))
    with pytest.raises(NodeConfigError) as agent_says:
        load_node_config(config)
    assert (code, out) == (2, [])
    assert err == list(agent_says.value.problems)
    assert [line.split(": ")[1] for line in err] == ["default.mode", "gpus[1].model", "gpus[2].productName"]
    assert all(line.startswith(f"node config {config}: ") for line in err)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "{model: L4, mode: mig-dynamic}",
            "gpus[0].mode: mig-dynamic on any L4 (NVIDIA L4): this GPU does not support MIG",
        ),
        (
            "{model: L4, mode: vgpu-partitions, vgpu: {partitions: [{memory: 40Gi}]}}",
            "gpus[0].vgpu.partitions[0].memory: 40960Mi does not fit any L4 (NVIDIA L4), which has 23034Mi",
        ),
        (
            "{productName: NVIDIA A100-SXM4-80GB, mode: mig-dynamic, mig: {profiles: [9g.99gb]}}",
            "gpus[0].mig.profiles: ['9g.99gb'] not offered by any A100-SXM4-80GB (NVIDIA A100-SXM4-80GB)",
        ),
    ],
)
def test_model_entries_no_gpu_of_their_model_could_take_are_refused_without_hardware(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str, message: str
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(f"gpus: [{entry}]\n")
    code, _, err = validate(capsys, str(config))
    assert code == 2
    (line,) = err
    assert line.startswith(f"node config {config}: {message}")


def test_with_hardware_every_gpu_the_agent_would_leave_out_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("gpus: [{model: A100-SXM4-80GB, mode: mig-dynamic}, {index: 9, mode: gpu}]\n")
    code, out, err = validate(capsys, str(config), "--hardware", "simulated:mixed", "--node-name", "n")
    gpus = simulated_node("mixed", "n")
    assert (code, out) == (2, [])
    assert err[0].startswith(f"node config {config}: gpus[1]: no GPU with index 9 on this node")
    for line, gpu in zip(err[1:], gpus[4:6], strict=True):
        described = f"GPU {gpu.index} (NVIDIA A100-SXM4-80GB, {gpu.uuid})"
        assert line.startswith(f"node config {config}: gpus[0].mode: mig-dynamic on {described}")
        assert line.endswith("; this GPU would be left out")
    # A model entry for GPUs a node lacks is fine there: one file serves the fleet.
    config.write_text("gpus: [{model: A100-SXM4-80GB, mode: mig-dynamic}]\n")
    code, out, _ = validate(capsys, str(config), "--hardware", "simulated:l4x8")
    assert code == 0
    assert out[1:] == [f"  GPU {index} (NVIDIA L4, model L4): gpu" for index in range(8)]


def test_a_directory_of_named_configs_is_checked_file_by_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_configmap(
        tmp_path, {"default.yaml": "{}\n", "l4.yaml": "gpus: [{model: L4, mode: vgpu-capacity}]\n"}
    )
    code, out, err = validate(capsys, str(tmp_path))
    assert (code, err) == (0, [])
    assert out == [
        f"{tmp_path}/default.yaml: valid (default: auto)",
        f"{tmp_path}/l4.yaml: valid (default: auto; model L4: vgpu-capacity)",
    ]
    write_configmap(tmp_path, {"default.yaml": "{}\n", "bad.yaml": "gpus: [{model: L4, mode: mig-static}]\n"})
    code, _, err = validate(capsys, str(tmp_path))
    assert code == 2
    assert err == [
        f"node config {tmp_path}/bad.yaml: gpus[0].mode: mig-static on any L4 (NVIDIA L4): this GPU does not "
        "support MIG"
    ]


@pytest.mark.parametrize(
    ("hardware", "code", "message"),
    [
        ("simulated:nope", 2, "--hardware simulated:nope: unknown simulated node profile 'nope'"),
        # No GPU here: NVML's library is missing, or (loaded by an earlier test in this
        # process, the mock) finds no driver; either way a run-time failure.
        ("nvml", 1, "--hardware nvml: "),
        ("gpu", 2, "--hardware (DRA_DRIVER_HARDWARE): 'gpu' is not 'nvml'"),
    ],
)
def test_hardware_that_cannot_be_read_is_exit_1_and_bad_hardware_names_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], hardware: str, code: int, message: str
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("{}\n")
    result, _, err = validate(capsys, str(config), "--hardware", hardware)
    assert result == code
    assert message in err[0]


def test_a_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = validate(capsys, str(tmp_path / "absent.yaml"))
    assert (code, err) == (2, [f"{tmp_path / 'absent.yaml'}: no such file or directory"])


def test_without_hami_core_a_gpu_asking_for_it_is_refused_as_the_agent_leaves_it_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("gpus: [{model: L4, mode: vgpu-capacity, vgpu: {enforcement: hami-core}}]\n")

    assert validate(capsys, str(config))[0] == 0
    assert validate(capsys, str(config), "--hardware", "simulated:l4x8")[0] == 0
    code, _, errors = validate(capsys, str(config), "--without-hami-core")
    assert code == 2
    assert errors == [
        f"node config {config}: gpus[0].vgpu.enforcement: hami-core on any L4 (NVIDIA L4) needs "
        "--hami-core-library, which this node's agent was not given, so every share's prepare would be "
        "refused; set it, or choose vgpu.enforcement mps or none"
    ]
    code, _, errors = validate(capsys, str(config), "--hardware", "simulated:l4x8", "--without-hami-core")
    # The model's line, then each L4 of the node.
    assert code == 2 and len(errors) == 9
    assert all("needs --hami-core-library" in line and "would be left out" in line for line in errors[1:])


def test_gpus_that_fit_but_offer_nothing_are_counted_next_to_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPUs 2 and 3 of the mixed node are in MIG mode without instances: `auto` fits them and they
    offer nothing, which the agent only logs; "valid" alone would read as "every GPU offered"."""
    config = tmp_path / "node.yaml"
    config.write_text("default: {mode: auto}\n")
    code, out, err = validate(capsys, str(config), "--hardware", "simulated:mixed", "--node-name", "n")
    assert (code, err) == (0, [])
    assert out[0] == f"{config}: valid; 2 of 8 GPUs offer nothing (notes below)"
    notes = [line for line in out if line.startswith("  note: GPU")]
    assert [note.split()[2] for note in notes] == ["2", "3"]


def test_a_key_given_twice_is_refused_with_both_lines_as_the_agent_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("default: {mode: auto}\ngpus: []\ndefault: {mode: gpu}\n")
    code, out, err = validate(capsys, str(config))
    with pytest.raises(NodeConfigError) as agent_says:
        load_node_config(config)
    assert (code, out) == (2, [])
    (line,) = err
    assert "key 'default' at line 3 is given twice (first at line 1)" in line
    assert "key 'default' at line 3 is given twice (first at line 1)" in str(agent_says.value)


def test_every_problem_of_one_object_is_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only the first: an unknown field, a bad mode and a bad partition of one entry, each on
    its line, the same lines as the agent's."""
    config = tmp_path / "node.yaml"
    config.write_text(
        "default: {mode: whole, colour: red}\n"
        "gpus:\n"
        "  - {index: x, mode: vgpu-partitions, vgpu: {enforcement: strict, partitions: [{cores: 200}]}}\n"
    )
    code, out, err = validate(capsys, str(config))
    with pytest.raises(NodeConfigError) as agent_says:
        load_node_config(config)
    assert (code, out) == (2, [])
    assert err == list(agent_says.value.problems)
    assert [line.split(": ")[1] for line in err] == [
        "default.colour",
        "default.mode",
        "gpus[0].index",
        "gpus[0].vgpu.partitions[0].memory",
        "gpus[0].vgpu.partitions[0].cores",
        "gpus[0].vgpu.enforcement",
    ]
