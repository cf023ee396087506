"""One supported range of Kubernetes versions and one default (dra_driver/base/kubernetes_versions.py),
in every command that takes `--kubernetes-version`, in the chart's `kubeVersion`, and in the
versions the e2e suite knows. A command that accepted 1.99, or a second default, would render
objects for a cluster nobody tested."""

import argparse
from pathlib import Path

import pytest
import yaml

from dra_driver.base.kubernetes_versions import (
    DEFAULT_KUBERNETES,
    NEWEST_MINOR,
    OLDEST_MINOR,
    kubernetes_version_problem,
)
from dra_driver.cli import build_parser, main
from dra_driver.devices import classes
from tests.cluster.versions import MINORS

REPOSITORY = Path(__file__).resolve().parents[2]
COMMANDS = ("manifests", "inspect")


def _version_option(command: str) -> argparse.Action:
    (subcommands,) = [a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)]
    parser: argparse.ArgumentParser = subcommands.choices[command]
    (action,) = [action for action in parser._actions if "--kubernetes-version" in action.option_strings]
    return action


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_the_one_default_and_says_the_range(command: str) -> None:
    action = _version_option(command)
    assert action.default == DEFAULT_KUBERNETES
    assert f"1.{OLDEST_MINOR} to 1.{NEWEST_MINOR}" in (action.help or "")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "version", [f"1.{OLDEST_MINOR - 1}", f"1.{NEWEST_MINOR + 1}", "1.99", "2.0", "1.034"]
)
def test_every_command_refuses_a_version_outside_the_range(
    command: str, version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--hardware", "simulated:dgx-h100"] if command == "inspect" else []
    assert main([command, "--kubernetes-version", version, *extra]) == 2
    assert "--kubernetes-version" in capsys.readouterr().err


def test_the_classes_tool_refuses_it_too() -> None:
    with pytest.raises(SystemExit) as exited:
        classes.main(["--kubernetes-version", f"1.{NEWEST_MINOR + 1}"])
    assert exited.value.code == 2


@pytest.mark.parametrize("minor", range(OLDEST_MINOR, NEWEST_MINOR + 1))
def test_every_supported_version_is_accepted(minor: int) -> None:
    assert kubernetes_version_problem(f"1.{minor}") is None


def test_the_chart_and_the_e2e_versions_span_the_same_range() -> None:
    chart = yaml.safe_load((REPOSITORY / "deploy" / "helm" / "dra-driver" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">=1.{OLDEST_MINOR}.0-0 <1.{NEWEST_MINOR + 1}.0-0"
    assert tuple(f"1.{minor}" for minor in range(OLDEST_MINOR, NEWEST_MINOR + 1)) == MINORS
