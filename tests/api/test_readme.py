"""The README's operator material says what the code does: its node-config example is the shipped
file and validates as shown, and its tables name every chart value, `manifests` flag and agent
flag there is.

The README is what an operator installs from; a table that misses a flag or an example that the
agent refuses sends them to the cluster with a mistake.
"""

import argparse
import re
from pathlib import Path

import pytest
import yaml

from dra_driver.cli import build_parser, main
from dra_driver.tools.manifests import DEFAULT_IMAGE

REPOSITORY = Path(__file__).resolve().parents[2]
README = (REPOSITORY / "README.md").read_text()
FLEET_EXAMPLE = REPOSITORY / "deploy" / "examples" / "node-configs" / "mixed-fleet.yaml"
CHART_VALUES = REPOSITORY / "deploy" / "helm" / "dra-driver" / "values.yaml"


def section(title: str) -> str:
    """The text from a heading to the next heading of the same or a higher level (a `#` line
    inside a fenced block is a comment, not a heading)."""
    lines = README.split("\n")
    start = lines.index(next(line for line in lines if re.fullmatch(rf"#+ {re.escape(title)}", line)))
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    in_fence = False
    for number, line in enumerate(lines[start + 1 :], start + 1):
        in_fence ^= line.startswith("```")
        heading = re.match(r"(#+) ", line)
        if not in_fence and heading and len(heading[1]) <= level:
            return "\n".join(lines[start + 1 : number])
    return "\n".join(lines[start + 1 :])


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def table_names(text: str) -> set[str]:
    """Every `code` name in the first column of the section's table rows."""
    names = set()
    for row in re.findall(r"^\| ([^|]+)\|", text.replace("\\|", "/"), re.M):
        names.update(re.findall(r"`([^`]+)`", row))
    return names


def test_the_node_config_example_is_the_shipped_file() -> None:
    (example,) = fenced(section("How each GPU is offered: node configs"), "yaml")

    assert example == FLEET_EXAMPLE.read_text()


def test_the_node_config_example_validates_as_the_readme_shows(capsys: pytest.CaptureFixture[str]) -> None:
    (console,) = fenced(section("How each GPU is offered: node configs"), "console")
    command, *shown = console.rstrip("\n").split("\n")
    args = command.removeprefix("$ dra-driver ").split()

    code = main([*args, "--node-name", "gpu-node-1"])

    assert code == 0
    assert capsys.readouterr().out.rstrip("\n").split("\n") == shown


def test_the_documented_build_makes_the_default_image() -> None:
    built = re.findall(r"docker build -t (\S+) \.", section("Build and push the image"))

    assert built == [DEFAULT_IMAGE]


def leaf_values(values: dict[str, object], prefix: str = "") -> set[str]:
    """`a.b` for nested settings the operator sets one by one; maps of free-form content
    (resources, affinity, ...) count as one value."""
    names = set()
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key in (
            "extendedResources",
            "global",
            "image",
            "hamiCore",
            "metrics",
            "podMonitor",
            "dashboard",
            "prometheusRule",
            "usage",
            "serviceAccount",
            "openshift",
        ):
            names |= leaf_values(value, f"{name}.")
        else:
            names.add(name)
    return names


def documented_values(text: str) -> set[str]:
    """Names in the values table, with `a.b` / `.c` / `.d` rows expanded."""
    names: set[str] = set()
    for row in re.findall(r"^\| ([^|]+)\|", text.replace("\\|", "/"), re.M):
        codes = re.findall(r"`([^`]+)`", row)
        if not codes:
            continue  # the header row
        first, *rest = codes
        names.add(first)
        stem = first.rsplit(".", 1)[0]
        names.update(f"{stem}{part}" if part.startswith(".") else part for part in rest)
    return names


def test_the_values_table_names_every_chart_value() -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())

    assert leaf_values(values) <= documented_values(section("With Helm"))


def options_of(command: str) -> set[str]:
    parser = build_parser()
    (subcommands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    subparser = subcommands.choices[command]
    return {
        option
        for action in subparser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def test_the_manifests_table_names_every_flag() -> None:
    documented = {name.split()[0] for name in table_names(section("With plain manifests"))}

    assert options_of("manifests") <= documented


def test_the_node_options_table_names_every_flag() -> None:
    documented = {name.split()[0] for name in table_names(section("`dra-driver node` options"))}

    assert options_of("node") - {"--verbose"} <= documented
