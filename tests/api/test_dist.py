"""The CLI installed the one documented way (README, "1. Get the `dra-driver` command"): `make
dist` builds the wheel and sdist a release uploads to PyPI, `pipx install` of the wheel puts
`dra-driver` on the PATH, and the README's try-it commands run as printed with that command
alone, not the checkout's `.venv`.

A user once had no route but the test extra (mypy, ruff, grpcio-tools, Helm, actionlint), and a
message named an extra of a package nobody could install. The install reaches the package
registry for the dependencies, as `pipx install` does on a user's machine.
"""

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from dra_driver import __version__
from tests.support.doc_pages import REPOSITORY, find_section

WHEEL = f"dra_driver-{__version__}-py3-none-any.whl"


def _run(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=cwd, env=env)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(["make", "--no-print-directory", "dist", f"DIST={out}"], cwd=REPOSITORY)
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory pipx put `dra-driver` in."""
    home = tmp_path_factory.mktemp("pipx")
    env = {**os.environ, "PIPX_HOME": str(home / "home"), "PIPX_BIN_DIR": str(home / "bin")}
    _run(["pipx", "install", str(dist / WHEEL)], env=env)
    return home / "bin"


def test_make_dist_builds_a_wheel_and_an_sdist_with_the_data_the_cli_reads(dist: Path) -> None:
    assert sorted(path.name for path in dist.iterdir()) == sorted([f"dra_driver-{__version__}.tar.gz", WHEEL])
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"dra_driver-{__version__}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"dra_driver-{__version__}.dist-info/entry_points.txt").decode()
    assert {
        "dra_driver/hardware/catalog/gpus.yaml",
        "dra_driver/hardware/catalog/node-profiles.yaml",
    } <= names
    assert "dra_driver/py.typed" in names
    assert "dra-driver = dra_driver.cli:main" in entry_points
    # The extra the plot command's message names.
    assert "Provides-Extra: plot" in metadata
    assert not any(name.startswith("tests/") for name in names)


def test_the_readme_install_is_the_one_tested_here() -> None:
    _, section = find_section("1. Get the `dra-driver` command")
    assert "make dist" in section
    assert f"pipx install dist/{WHEEL}" in section


def test_the_readme_try_it_commands_run_with_the_installed_cli_alone(installed: Path) -> None:
    """Every command line of the README's try-it blocks, with the pipx-installed `dra-driver`
    first on a PATH that has no `.venv` (`make demo` is the same command through the Makefile)."""
    _, section = find_section("2. Try it without a GPU")
    lines = [
        line.split("  #")[0].strip()
        for block in re.findall(r"```sh\n(.*?)```", section, re.S)
        for line in block.splitlines()
        if line.startswith("dra-driver ")
    ]
    assert len(lines) >= 4, lines
    env = {**os.environ, "PATH": f"{installed}:/usr/bin:/bin"}
    for line in lines:
        _run(["sh", "-c", line], cwd=REPOSITORY, env=env)
    version = _run([str(installed / "dra-driver"), "--version"])
    assert version.stdout.strip() == f"dra-driver {__version__}"
