"""The shell scripts pass shellcheck, and hack/kind-up.sh installs what tests/e2e expect.

The kind scripts cannot run here (no Docker engine), so shellcheck is what reads them on every
run. It is a system tool (`apt-get install shellcheck`; .ci/run installs it): a missing one fails
these tests instead of skipping them.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.classes import APP_NAME
from dra_driver.tools.manifests import DEFAULT_NAMESPACE
from tests.e2e.deploy import NODE_LABEL

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPTS = [*sorted((REPOSITORY / "hack").glob("*.sh")), REPOSITORY / ".ci" / "run"]
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
