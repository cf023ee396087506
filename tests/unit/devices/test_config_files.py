"""Named node configs: which file the Node's label picks, and what a missing or malformed one
offers (nothing, with problems naming the label, the file and the fields)."""

from pathlib import Path

from dra_driver.config.node_config_files import config_names, read_config_text
from dra_driver.devices.config_files import (
    ConfigChoice,
    choose_config,
    config_path,
)
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from tests.support.node_configs import write_configmap

LABEL = "dra-driver.dev/config"


def choose(directory: Path, label: str | None) -> ConfigChoice:
    text = read_config_text(config_path(directory, label))
    return choose_config(directory, LABEL, label, text, config_names(directory))


def test_the_label_names_the_file_and_a_node_without_it_uses_default_yaml(tmp_path: Path) -> None:
    write_configmap(
        tmp_path, {"default.yaml": "default: {mode: gpu}\n", "l4.yaml": "default: {mode: vgpu-capacity}\n"}
    )
    assert config_names(tmp_path) == ["default", "l4"]  # ..data and its directory are not configs

    named = choose(tmp_path, "l4")
    assert named.config == NodeConfig(default=GpuSettings(mode="vgpu-capacity"))
    assert (named.name, named.problems) == ("l4", ())
    unlabelled = choose(tmp_path, None)
    assert unlabelled.config == NodeConfig(default=GpuSettings(mode="gpu"))
    assert unlabelled.origin == f"node config {tmp_path}/default.yaml"


def test_without_label_and_default_yaml_gpus_get_the_built_in_defaults(tmp_path: Path) -> None:
    choice = choose(tmp_path, None)
    assert choice.config == NodeConfig()
    assert choice.problems == ()
    assert f"no label {LABEL} on the node" in choice.origin


def test_a_named_config_that_is_missing_offers_nothing(tmp_path: Path) -> None:
    write_configmap(tmp_path, {"a100.yaml": "{}\n"})
    choice = choose(tmp_path, "h100")
    assert choice.config is None
    (problem,) = choice.problems
    assert (problem.setting, problem.gpu) == (f"label {LABEL}", None)
    assert problem.message == (
        f"node label {LABEL}=h100 names config 'h100', but there is no {tmp_path}/h100.yaml "
        "(configs: a100); nothing is offered until it exists"
    )


def test_a_malformed_named_config_offers_nothing_and_names_every_field(tmp_path: Path) -> None:
    write_configmap(tmp_path, {"bad.yaml": "default: {mode: whole}\ngpus: [{model: A100}]\n"})
    choice = choose(tmp_path, "bad")
    assert choice.config is None
    assert [problem.setting for problem in choice.problems] == ["default.mode", "gpus[0].model"]
    assert choice.problems[0].message.startswith(f'node config {tmp_path}/bad.yaml: default.mode: "whole"')

    write_configmap(tmp_path, {"bad.yaml": "default: [\n"})
    (problem,) = choose(tmp_path, "bad").problems
    assert problem.setting == "file"
    assert problem.message.startswith(f"node config {tmp_path}/bad.yaml: not valid YAML")


def test_a_label_value_never_names_a_file_outside_the_directory(tmp_path: Path) -> None:
    (tmp_path / "outside.yaml").write_text("default: {mode: gpu}\n")
    configs = tmp_path / "configs"
    configs.mkdir()
    choice = choose_config(configs, LABEL, "../outside", None, [])
    assert choice.config is None
    assert choice.problems[0].message.startswith(f"node label {LABEL}=../outside: '../outside' cannot name")
