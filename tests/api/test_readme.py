"""The README's and the docs pages' operator material says what the code does: every command
block that can run here runs as shown, every link leads to a file and heading that exist, the
node-config example is the shipped file, the tables name every chart value, `manifests` flag and
agent flag there is, and the install summary names every permission and admission policy that
`dra-driver manifests` installs.

These pages are what an operator installs from; a table that misses a flag, an example that does
not reproduce, a link to a section that moved or a summary that leaves out a permission sends
them to the cluster with a mistake. Sections are found by their heading on whichever page holds
them (tests/support/doc_pages.py).
"""

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import build_parser, main
from dra_driver.tools.manifests import DEFAULT_IMAGE
from tests.cluster.versions import gate_table
from tests.support.doc_pages import REPOSITORY, broken_links, pages, section, text

FLEET_EXAMPLE = REPOSITORY / "deploy" / "examples" / "node-configs" / "mixed-fleet.yaml"
CHART_VALUES = REPOSITORY / "deploy" / "helm" / "dra-driver" / "values.yaml"


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


BUILD = r"docker build -t (\S+) \."


def test_the_documented_build_makes_the_default_image() -> None:
    built = re.findall(BUILD, section("Releases, and building the image yourself"))

    assert built == [DEFAULT_IMAGE]


def test_every_page_builds_the_default_image() -> None:
    """The README's quick start repeats the build; no page may build another tag."""
    built = {page: re.findall(BUILD, text(page)) for page in pages()}

    assert built["README.md"] == [DEFAULT_IMAGE]
    assert {tag for tags in built.values() for tag in tags} == {DEFAULT_IMAGE}


# The pages whose links are checked: the documentation, and the files it and the code cite.
LINKED_PAGES = (
    *pages(),
    "CHANGELOG.md",
    "deploy/examples/README.md",
    "api/resource.dra-driver.dev/v1alpha1/README.md",
)


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_link_leads_to_a_file_and_heading_that_exist(page: str) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the link check: a missing file, a missing heading on another page and on the
    same page are each found; a link inside a fenced block is not a link."""
    page = "docs/install.md"
    broken = "[a](no-such.md) [b](configuration.md#no-such-heading) [c](#no-such-heading)"
    fenced_only = "```sh\n[d](no-such-either.md)\n```\n"
    monkeypatch.setattr(
        "tests.support.doc_pages.text", lambda name: f"{fenced_only}{broken}\n" if name == page else ""
    )

    assert broken_links(page) == ["no-such.md", "configuration.md#no-such-heading", "#no-such-heading"]


def leaf_values(values: dict[str, object], prefix: str = "") -> set[str]:
    """`a.b` for nested settings the operator sets one by one; maps of free-form content
    (resources, affinity, ...) count as one value."""
    names = set()
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key in (
            "claimPolicy",
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


def test_the_gates_table_is_the_local_clusters_own() -> None:
    """The gates the local cluster turns on (tests/cluster/versions.py, checked against each
    pinned release's own feature list by the e2e suite) are the table operators read."""
    assert gate_table() in section("Kubernetes versions and feature gates")


def test_the_values_table_names_every_chart_value() -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())

    assert leaf_values(values) <= documented_values(section("With Helm"))


def test_the_values_table_names_no_command_line_flags() -> None:
    assert {name for name in documented_values(section("With Helm")) if name.startswith("-")} == set()


def test_the_values_comments_name_files_that_exist() -> None:
    comments = "\n".join(
        line for line in CHART_VALUES.read_text().splitlines() if line.lstrip().startswith("#")
    )
    named = re.findall(r"\b((?:deploy|files)/[\w./-]+\.(?:json|ya?ml))", comments)

    assert named
    for path in named:
        base = REPOSITORY if path.startswith("deploy/") else CHART_VALUES.parent
        assert (base / path).is_file(), path


def test_the_install_summary_names_every_permission_and_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests"]) == 0
    installed = [item for item in yaml.safe_load_all(capsys.readouterr().out) if item]
    summary = " ".join(section("What gets installed").split())

    def placeholders(name: str) -> str:
        return name.replace(DEFAULT_DRIVER_NAME, "<driver>").replace("dra-driver", "<release>")

    # Bindings are said with what they bind ("bound cluster-wide", "each with its binding").
    for kind in {item["kind"] for item in installed if not item["kind"].endswith("Binding")}:
        assert re.search(rf"\b{kind.removesuffix('y')}", summary), kind
    policies = [item for item in installed if item["kind"] == "ValidatingAdmissionPolicy"]
    assert f"{NUMBERS[len(policies)]} ValidatingAdmissionPolicies, each with its binding" in summary
    for policy in policies:
        assert f"`{placeholders(policy['metadata']['name'])}`" in summary
    roles = [item for item in installed if item["kind"] in ("ClusterRole", "Role")]
    assert len(roles) == 2
    for role in roles:
        assert f"{role['kind']} `{placeholders(role['metadata']['name'])}`" in summary
        for rule in role["rules"]:
            verbs = "/".join(f"`{verb}`" for verb in rule["verbs"])
            for resource in rule["resources"]:
                assert f"{verbs} `{resource}`" in summary
            if rule["resources"] == ["nodes"] and "resourceNames" not in rule:
                assert f"{verbs} `nodes` (every Node" in summary


NUMBERS = ("no", "one", "two", "three", "four", "five")


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


# -- every command block runs as shown --

NOT_RUN = re.compile(r"<!-- not run: (\S.*) -->")
EXITS = re.compile(r"#\s*exits ([0-9]+)")
SHELLS = ("sh", "console")


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced shell block: `sh` runs whole, `console` is `$ command` lines each followed by
    its output (a `...` line stands for any lines). A command exits 0 unless its comment says
    `# exits N`. `not_run`: the reason of the HTML comment right before the block, for blocks
    that cannot run here. `line`: the opening fence's line number on `page`."""

    page: str
    line: int
    language: str
    text: str
    not_run: str | None


def page_blocks(page: str) -> list[Block]:
    lines = text(page).split("\n")
    blocks = []
    number = 0
    while number < len(lines):
        fence = re.fullmatch(r"```(\w*)", lines[number])
        if not fence:
            number += 1
            continue
        end = lines.index("```", number + 1)
        if fence[1] in SHELLS:
            marker = NOT_RUN.fullmatch(lines[number - 1])
            body = "\n".join(lines[number + 1 : end]) + "\n"
            blocks.append(Block(page, number + 1, fence[1], body, marker[1] if marker else None))
        number = end + 1
    return blocks


# Pages whose blocks are not run yet, each with why: their blocks are not marked one by one.
# docs/e2e.md's blocks build and start a cluster (`make e2e`, `hack/e2e.sh`).
def command_blocks() -> list[Block]:
    return [block for page in pages() for block in page_blocks(page)]


RUNNABLE = [block for block in command_blocks() if block.not_run is None]


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A scratch copy of the checkout's top level (links, so the blocks' relative paths work and
    what they write stays out of the repository), with `dra-driver` on the PATH running this
    checkout, and `make`'s virtual environment standing in as already installed."""
    work = tmp_path_factory.mktemp("readme")
    for entry in REPOSITORY.iterdir():
        if entry.name not in (".git", ".venv"):
            (work / entry.name).symlink_to(entry)
    venv_bin = work / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    shim = venv_bin / "dra-driver"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m dra_driver "$@"\n')
    shim.chmod(0o755)
    (work / "venv" / ".installed").touch()
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPOSITORY),
        "VENV": str(work / "venv"),
    }
    return work, env


def shown_output_matches(shown: list[str], printed: list[str]) -> bool:
    """Each run of shown lines between `...` lines appears in the printed lines, in order."""
    parts: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            parts.append([])
        else:
            parts[-1].append(line.rstrip())
    position = 0
    for part in parts:
        while part and not part[-1]:
            part.pop()
        while position + len(part) <= len(printed) and printed[position : position + len(part)] != part:
            position += 1
        if position + len(part) > len(printed):
            return False
        position += len(part)
    return True


def test_every_block_runs_here_or_says_why_not() -> None:
    blocks = command_blocks()

    assert len(blocks) > len(RUNNABLE) > 0
    assert all(block.not_run is None or block.not_run.strip() for block in blocks)
    # The README and at least one docs page have blocks that run: both are read.
    assert {"README.md"} < {block.page for block in RUNNABLE}


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: f"{block.page}:{block.line}")
def test_the_command_block_runs_as_shown(block: Block, shell_env: tuple[Path, dict[str, str]]) -> None:
    work, env = shell_env
    if block.language == "sh":
        commands: list[tuple[str, list[str]]] = [(block.text, [])]
    else:
        commands = [
            (command, output.split("\n"))
            for command, _, output in (
                part.partition("\n") for part in block.text.removeprefix("$ ").split("\n$ ")
            )
        ]

    for command, shown in commands:
        ran = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", command],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

        expected = int(stated[1]) if (stated := EXITS.search(command)) else 0
        assert ran.returncode == expected, f"{command}\n{ran.stdout}\n{ran.stderr}"
        printed = [line.rstrip() for line in ran.stdout.split("\n")]
        assert shown_output_matches(shown, printed), f"{command}\nshown:\n{shown}\nprinted:\n{printed}"
