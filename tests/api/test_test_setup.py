"""`make test` on a fresh machine: the system packages are installed by the test command itself,
and CI runs exactly the README's test commands (its "Tests" section).

A fresh clone once failed `make test` (shellcheck missing) while CI passed, because only CI's own
script installed the packages. These tests keep the install in the command everyone runs.
"""

import re
import subprocess
from pathlib import Path

from tests.support.doc_pages import REPOSITORY, find_section

INSTALLER = REPOSITORY / "hack" / "install-test-deps.sh"


def documented_test_commands() -> list[str]:
    """The commands of the README's "Tests" section: `make test` and the e2e suite on the local
    cluster, once per version."""
    page, section = find_section("Tests")
    assert page == "README.md", page
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    commands = [
        line.split("#")[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.startswith(("make test", "make e2e"))
    ]
    assert commands[:1] == ["make test"], commands
    return commands


def test_ci_runs_exactly_the_documented_test_commands() -> None:
    script = (REPOSITORY / ".ci" / "run").read_text()
    commands = [
        line.strip()
        for line in script.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))
    ]

    assert commands == documented_test_commands()


def test_make_test_installs_the_system_packages_first() -> None:
    """`test` depends on `test-deps` before anything else, so no test runs without them."""
    makefile = (REPOSITORY / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", makefile, re.M)

    assert test_rule is not None
    assert test_rule[1].split()[0] == "test-deps"
    assert "hack/install-test-deps.sh" in makefile
    assert re.search(r"^export DRA_DRIVER_REQUIRE_PODMAN \?= 1$", makefile, re.M)


def shim_directory(tmp_path: Path, uid: int) -> Path:
    """A PATH on which only the basic tools exist and `id -u` answers `uid`: a machine where
    nothing the tests need is installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "test"):
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    (bin_dir / "id").write_text(f"#!/usr/bin/bash\necho {uid}\n")
    (bin_dir / "id").chmod(0o755)
    return bin_dir


def run_installer(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/bash", str(INSTALLER)],
        env={"PATH": str(bin_dir), "PYTHON": "/nonexistent/python3"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_without_root_it_stops_with_one_line_naming_the_command(tmp_path: Path) -> None:
    result = run_installer(shim_directory(tmp_path, uid=1000))

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "apt-get install -y --no-install-recommends" in lines[0]
    for package in ("podman", "runc", "shellcheck", "openssl", "gcc", "python3-venv"):
        assert package in lines[0]


def test_as_root_without_apt_it_stops_with_the_same_line(tmp_path: Path) -> None:
    result = run_installer(shim_directory(tmp_path, uid=0))

    assert result.returncode == 1
    assert "run as root: apt-get update && apt-get install" in result.stderr


def test_on_this_machine_everything_is_installed() -> None:
    """After `make test-deps` the check finds nothing missing and installs nothing."""
    result = subprocess.run(
        ["bash", str(INSTALLER)], capture_output=True, text=True, timeout=600, check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
