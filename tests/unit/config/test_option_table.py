"""The option table is the one place a flag and its variable are named: the DaemonSet sets only
variables the agent reads, and every subcommand that reads a variable reads the table's."""

import argparse
import re

import pytest

from dra_driver.cli import build_parser, main
from dra_driver.config.option_table import AGENT_OPTIONS
from dra_driver.tools.manifests import ManifestOptions, render

# Read by the agent outside the table (switches), and the NVIDIA runtime's own variable.
NOT_ROWS = {"DRA_DRIVER_VERBOSITY", "DRA_DRIVER_DRY_RUN", "NVIDIA_VISIBLE_DEVICES"}
ROWS = {option.flag: option for option in AGENT_OPTIONS}


def subparsers(parser: argparse.ArgumentParser, name: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child_name, child in action.choices.items():
                found += subparsers(child, f"{name} {child_name}".strip())
    return found


def test_every_variable_the_daemon_set_sets_is_one_the_agent_reads() -> None:
    options = ManifestOptions(node_configs={"default": "{}\n"}, hami_core_library="/usr/lib/libvgpu.so")
    (daemon_set,) = [item for item in render(options) if item["kind"] == "DaemonSet"]
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    set_by_daemon_set = {entry["name"] for entry in container["env"]}

    assert set_by_daemon_set - NOT_ROWS <= {option.env for option in AGENT_OPTIONS}
    assert "DRA_DRIVER_HAMI_CORE_DIR" in set_by_daemon_set  # the optional parts were rendered


def test_a_subcommand_that_reads_a_variable_reads_the_one_its_flag_has_in_the_table() -> None:
    checked = 0
    for command, parser in subparsers(build_parser()):
        for action in parser._actions:
            named = re.search(r"\[env (\w+)", action.help or "")
            flag = next((option for option in action.option_strings if option in ROWS), None)
            if named and flag:
                assert named.group(1) == ROWS[flag].env, f"{command} {flag}"
                checked += 1
    assert checked > len(AGENT_OPTIONS)  # node, and inspect/cleanup/validate-config share rows


def test_a_bad_value_from_the_environment_names_the_flag_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRA_DRIVER_SYNC_DELAY", "soon")

    assert main(["node", "--node-name", "gpu-node-1"]) == 2
    assert capsys.readouterr().err == (
        "dra-driver node: --sync-delay (DRA_DRIVER_SYNC_DELAY): 'soon' must be a number of seconds "
        "from 0 to 3600\n"
    )
