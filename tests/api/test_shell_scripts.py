"""The shell scripts pass shellcheck, and hack/kind-up.sh installs what tests/e2e expect.

The kind scripts cannot run here (no Docker engine), so shellcheck is what reads them on every
run. It is a system tool (`apt-get install shellcheck`; .ci/run installs it): a missing one fails
these tests instead of skipping them.
"""

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.classes import APP_NAME
from dra_driver.tools.manifests import DEFAULT_NAMESPACE
from tests.e2e.deploy import NODE_LABEL

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPTS = [
    *sorted((REPOSITORY / "hack").glob("*.sh")),
    *sorted((REPOSITORY / "hack" / "gpu-check").glob("*.sh")),
    REPOSITORY / ".ci" / "run",
]
INSTALL = "shellcheck is not installed: apt-get install shellcheck (as root), as .ci/run does"


def shellcheck(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    program = shutil.which("shellcheck")
    assert program, INSTALL
    return subprocess.run(
        [program, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_every_script_passes_shellcheck(script: Path) -> None:
    checked = shellcheck("--external-sources", str(script))

    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_every_script_is_an_executable_bash_script_that_stops_at_the_first_error(script: Path) -> None:
    text = script.read_text()

    assert os.access(script, os.X_OK)
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


def test_shellcheck_finds_a_broken_script() -> None:
    """Guards the test above: an unquoted expansion in a script is reported."""
    checked = shellcheck("-", stdin="#!/usr/bin/env bash\nrm -rf $1/tmp\n")

    assert checked.returncode != 0
    assert "SC2086" in checked.stdout


def test_kind_up_waits_for_what_the_e2e_installation_renders() -> None:
    """The names kind-up.sh waits for and the label it puts on the worker are those of the
    rendering it applies (tests/e2e/deploy.py)."""
    text = (REPOSITORY / "hack" / "kind-up.sh").read_text()
    settings = dict(re.findall(r"^([a-z_]+)=([^\s$]+)$", text, flags=re.MULTILINE))

    assert settings["namespace"] == DEFAULT_NAMESPACE
    assert settings["daemon_set"] == APP_NAME
    assert settings["node_label"] == "=".join(NODE_LABEL)
    assert settings["driver"] == DEFAULT_DRIVER_NAME


def test_the_gpu_check_wheelhouse_downloads_every_runtime_dependency_for_cpython_312() -> None:
    """What the GPU machine installs without an index must hold pyproject's dependencies and
    what the check runs on, as cp312 manylinux x86_64 wheels."""
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    done = subprocess.run(
        [str(REPOSITORY / "hack" / "gpu-check" / "wheelhouse.sh"), "--dry-run", "/tmp/wheels"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout)
    assert words[1:4] == ["-m", "pip", "download"]
    for option in ("--only-binary=:all:", "--python-version 3.12", "--abi cp312", "--dest /tmp/wheels"):
        assert option in " ".join(words)
    assert {"manylinux2014_x86_64", "manylinux_2_28_x86_64"} <= set(words)
    needed = [
        *project["dependencies"],
        *(
            r
            for r in project["optional-dependencies"]["test"]
            if r.startswith(("aiohttp", "kubernetes-validate", "jsonschema", "pytest>", "hypothesis"))
        ),
    ]
    assert words[-len(needed) :] == needed


@pytest.mark.parametrize(
    ("script", "args"),
    [("wheelhouse.sh", []), ("wheelhouse.sh", ["--dry-run"]), ("run.sh", ["--out", "/tmp/x"])],
)
def test_the_gpu_check_scripts_refuse_missing_arguments(script: str, args: list[str]) -> None:
    done = subprocess.run(
        [str(REPOSITORY / "hack" / "gpu-check" / script), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert (done.returncode, done.stderr.startswith("usage:")) == (2, True)


def test_the_gpu_check_refuses_a_wheel_folder_without_wheels(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(REPOSITORY / "hack" / "gpu-check" / "run.sh"),
            "--wheels",
            str(tmp_path),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert done.returncode == 2
    assert f"--wheels {tmp_path}: no .whl files there" in done.stderr
