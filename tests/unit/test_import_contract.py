"""The layer contract of pyproject.toml holds on the tree, and each of its contracts catches an
import that breaks it: run on a copy of the package with one bad import added, lint-imports
fails and names that contract (and only that one), so the contract is shown to guard."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
PYPROJECT = REPOSITORY / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contract_names() -> dict[str, str]:
    """Contract id -> the name lint-imports reports it by."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {contract["id"]: contract["name"] for contract in config["contracts"]}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the repository's contracts on the `dra_driver` package under `root`,
    found there first on the path (before the editable install of the repository)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(PYPROJECT)],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def verdicts(output: str) -> dict[str, str]:
    """Contract name -> KEPT or BROKEN, from the summary lint-imports prints."""
    found = {}
    for name in contract_names().values():
        for verdict in ("KEPT", "BROKEN"):
            if any(line.startswith(f"{name} {verdict}") for line in output.splitlines()):
                found[name] = verdict
    return found


def test_the_tree_keeps_every_contract() -> None:
    done = lint_imports(REPOSITORY)

    names = contract_names()
    assert set(names) == {
        "pure-cores",
        "hardware-at-the-bottom",
        "kube-edge-below-publish",
        "metrics-vocabulary",
    }
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == dict.fromkeys(names.values(), "KEPT")


@pytest.mark.parametrize(
    ("module", "bad_import", "contract", "reported"),
    [
        pytest.param(
            "claims/claim_plan.py",
            "from dra_driver.claims.record_store import ClaimRecordStore",
            "pure-cores",
            "dra_driver.claims.claim_plan -> dra_driver.claims.record_store",
            id="claim plan imports the record store",
        ),
        pytest.param(
            # Not a pure core itself, but the device model reaches it (through the node config).
            "hardware/catalog.py",
            "import subprocess",
            "pure-cores",
            "dra_driver.hardware.catalog -> subprocess",
            id="transitively, through what a core imports",
        ),
        pytest.param(
            "hardware/events.py",
            "from dra_driver.health.model import HealthStatus",
            "hardware-at-the-bottom",
            "dra_driver.hardware.events -> dra_driver.health.model",
            id="hardware imports health",
        ),
        pytest.param(
            "hardware/time_slicing.py",
            "from dra_driver.claims.opaque_config import Sharing",
            "hardware-at-the-bottom",
            "dra_driver.hardware.time_slicing -> dra_driver.claims.opaque_config",
            id="hardware imports claims",
        ),
        pytest.param(
            # What kube/pod_api.py did before issue 31: the generic calls lived in publish/.
            "kube/pod_api.py",
            "from dra_driver.publish.diff import JsonObject",
            "kube-edge-below-publish",
            "dra_driver.kube.pod_api -> dra_driver.publish.diff",
            id="kube imports publish",
        ),
        pytest.param(
            "claims/status_writer.py",
            "from dra_driver.publish.workqueue import WorkQueue",
            "kube-edge-below-publish",
            "dra_driver.claims.status_writer -> dra_driver.publish.workqueue",
            id="claims import publish",
        ),
        pytest.param(
            "observability/metrics.py",
            "from dra_driver.claims.errors import ClaimRejected",
            "metrics-vocabulary",
            "dra_driver.observability.metrics -> dra_driver.claims.errors",
            id="metrics import an error type",
        ),
    ],
)
def test_a_bad_import_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, contract: str, reported: str
) -> None:
    shutil.copytree(
        REPOSITORY / "dra_driver", tmp_path / "dra_driver", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "dra_driver" / module
    target.write_text(f"{target.read_text()}\n{bad_import}\n")

    done = lint_imports(tmp_path)

    names = contract_names()
    assert done.returncode == 1, done.stdout + done.stderr
    expected = {name: "BROKEN" if key == contract else "KEPT" for key, name in names.items()}
    assert verdicts(done.stdout) == expected, done.stdout
    assert reported in done.stdout
