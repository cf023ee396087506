"""What can be checked without the node is checked by `validate-config`, `manifests` and the
agent's start alike (issue 33): MIG profile names against the catalog, duplicate selectors, the
names of a config directory's files, and hostile YAML refused before it is decoded."""

import time
import tracemalloc
from pathlib import Path

import pytest

from dra_driver.cli import main
from dra_driver.hardware.catalog import catalog_mig_profile_names, gpu_models
from tests.support.node_configs import write_configmap
from tests.unit.base.test_bounded_yaml import alias_bomb

BOGUS_PROFILE = "default: {mode: mig-dynamic, mig: {profiles: [1g.10gb, bogus]}}\n"
# A name only B200s offer: valid for some model, so valid without the node.
B200_ONLY = "default: {mode: mig-dynamic, mig: {profiles: [1g.23gb]}}\n"
TWO_FOR_INDEX_0 = "gpus: [{index: 0, mode: gpu}, {index: 0, mode: vgpu-capacity}]\n"


def agent_start(tmp_path: Path, *flags: str) -> list[str]:
    """`dra-driver node` with its directories under tmp_path: the option checks run first."""
    directories = ("--state-dir", "--plugins-dir", "--registrar-dir", "--cdi-dir")
    return [
        "node",
        "--node-name",
        "gpu-node-1",
        "--hardware",
        "simulated:t4x4",
        *flags,
        *(argument for flag in directories for argument in (flag, str(tmp_path / flag.strip("-")))),
    ]


def run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


def test_the_catalog_names_every_mig_profile_of_every_model() -> None:
    names = catalog_mig_profile_names()
    for model in gpu_models().values():
        assert {profile.name for profile in (model.mig.profiles if model.mig else ())} <= names
    assert {"1g.10gb", "1g.23gb", "7g.80gb", "1g.10gb+me"} <= names
    assert "bogus" not in names


@pytest.mark.parametrize("command", ["validate-config", "manifests"])
def test_a_mig_profile_no_model_offers_is_refused_without_the_node(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(BOGUS_PROFILE)
    args = [command, str(config)] if command == "validate-config" else [command, "--node-config", str(config)]
    code, err = run(capsys, args)
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert 'default.mig.profiles[1]: "bogus" is not a MIG profile of any GPU model of the catalog' in err, err


@pytest.mark.parametrize("command", ["validate-config", "manifests"])
def test_a_mig_profile_of_any_model_passes_without_the_node(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(B200_ONLY)
    args = [command, str(config)] if command == "validate-config" else [command, "--node-config", str(config)]
    code, err = run(capsys, args)
    assert code == 0, err


def test_with_the_node_its_models_decide_the_mig_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(B200_ONLY)
    code, err = run(capsys, ["validate-config", str(config), "--hardware", "simulated:dgx-h100-mig"])
    assert code == 2
    assert "['1g.23gb'] not offered by GPU 0 (NVIDIA H100 80GB HBM3" in err


@pytest.mark.parametrize("where", ["validate-config", "manifests", "node"])
def test_two_entries_for_one_index_are_refused_by_every_command(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(TWO_FOR_INDEX_0)
    args = {
        "validate-config": ["validate-config", str(config)],
        "manifests": ["manifests", "--node-config", str(config)],
        "node": agent_start(tmp_path, "--node-config", str(config)),
    }[where]
    code, err = run(capsys, args)
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert "gpus[1]: selects the same GPUs as gpus[0] (index 0)" in err
    assert not (tmp_path / "state-dir").exists(), "refused before anything ran"


BAD_NAMES = {
    "bad name!.yaml": "'bad name!' is not a label value (letters, digits, '-', '_' and '.'",
    "ok.yml": "configs are read from <name>.yaml files only; rename it 'ok.yaml'",
    f"{'a' * 64}.yaml": "is longer than 63 characters",
}


@pytest.mark.parametrize("where", ["validate-config", "node"])
@pytest.mark.parametrize(("file_name", "problem"), BAD_NAMES.items(), ids=BAD_NAMES.keys())
def test_a_config_file_no_label_can_choose_is_refused_not_skipped(
    where: str, file_name: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "configs"
    write_configmap(
        directory, {"default.yaml": "default: {mode: gpu}\n", file_name: "default: {mode: gpu}\n"}
    )
    args = {
        "validate-config": ["validate-config", str(directory)],
        "node": agent_start(tmp_path, "--node-configs", str(directory)),
    }[where]
    code, err = run(capsys, args)
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert f"{directory}: " in err
    assert problem in err


def test_a_config_directory_of_good_names_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "configs"
    write_configmap(directory, {"default.yaml": "default: {mode: gpu}\n", "mig_1.x-y.yaml": B200_ONLY})
    code, err = run(capsys, ["validate-config", str(directory)])
    assert code == 0, err


@pytest.mark.parametrize("levels", [3, 9])
@pytest.mark.parametrize("where", ["validate-config", "manifests", "node"])
def test_an_alias_bomb_is_one_line_at_once_in_bounded_memory(
    where: str, levels: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: with 9 levels of ten aliases each, 4 GB and no output from validate-config; with
    3, a line of 7.6 KB (the value printed whole)."""
    config = tmp_path / "node.yaml"
    config.write_text(alias_bomb(levels))
    args = {
        "validate-config": ["validate-config", str(config)],
        "manifests": ["manifests", "--node-config", str(config)],
        "node": agent_start(tmp_path, "--node-config", str(config)),
    }[where]
    run(capsys, args)  # the command's modules imported: what is measured is the work on the file
    tracemalloc.start()
    started = time.monotonic()
    code, err = run(capsys, args)
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert "an alias (*l0) at line 3, column 24: aliases are refused" in err
    assert len(err) < 300
    assert elapsed < 1.0
    assert peak < 8 * 2**20


def test_a_long_value_is_cut_short_in_its_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the 3-level bomb's productName printed whole, a 7.6 KB line; any long value was."""
    config = tmp_path / "node.yaml"
    config.write_text(f"gpus: [{{model: {'x' * 5000}}}, {{index: 0, vgpu: {'y' * 5000}}}]\n")
    code, err = run(capsys, ["validate-config", str(config)])
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 2
    assert "x" * 81 not in err
    assert "y" * 81 not in err
    assert all(len(line) < 1000 for line in lines), lines
    assert f"{'x' * 80!r}… (5000 characters) is not a GPU model" in lines[0]


def test_a_yaml_error_names_the_file_and_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("default:\n  mode: [gpu\n")
    for args in (
        ["validate-config", str(config)],
        ["inspect", "--hardware", "simulated:t4x4", "--node-config", str(config)],
        agent_start(tmp_path, "--node-config", str(config)),
    ):
        code, err = run(capsys, args)
        assert code == 2, err
        assert err.count("\n") == 1, err
        assert f"{config}: not valid YAML: " in err
        assert "at line 3, column 1" in err
        assert "<unicode string>" not in err
