"""The layer contract of pyproject.toml holds on the tree, and each of its contracts catches an
import that breaks it: run on a copy of the package with one bad import added, lint-imports
fails and names that contract (and only the contracts expected), so the contract is shown to
guard. The `layers` contract overlaps the forbidden ones where they forbid an upward import, so
those cases name both."""

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
        "layers",
        "claims-groups",
        "pure-cores",
        "hardware-at-the-bottom",
        "kube-edge-below-publish",
        "metrics-vocabulary",
        "lean-api-client",
    }
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == dict.fromkeys(names.values(), "KEPT")


@pytest.mark.parametrize(
    ("module", "bad_import", "contracts", "reported"),
    [
        pytest.param(
            "claims/claim_plan.py",
            "from dra_driver.claims.record_store import ClaimRecordStore",
            ("pure-cores", "claims-groups"),
            "dra_driver.claims.claim_plan -> dra_driver.claims.record_store",
            id="claim plan imports the record store",
        ),
        pytest.param(
            # Not a pure core itself, but the device model reaches it (through the node config).
            "hardware/catalog.py",
            "import subprocess",
            ("pure-cores",),
            "dra_driver.hardware.catalog -> subprocess",
            id="transitively, through what a core imports",
        ),
        pytest.param(
            "hardware/events.py",
            "from dra_driver.health.model import HealthStatus",
            ("hardware-at-the-bottom", "layers"),
            "dra_driver.hardware.events -> dra_driver.health.model",
            id="hardware imports health",
        ),
        pytest.param(
            "hardware/time_slicing.py",
            "from dra_driver.claims.opaque_config import Sharing",
            ("hardware-at-the-bottom", "layers"),
            "dra_driver.hardware.time_slicing -> dra_driver.claims.opaque_config",
            id="hardware imports claims",
        ),
        pytest.param(
            # What kube/pod_api.py did before issue 31: the generic calls lived in publish/.
            "kube/pod_api.py",
            "from dra_driver.publish.diff import plan_sync",
            ("kube-edge-below-publish", "layers"),
            "dra_driver.kube.pod_api -> dra_driver.publish.diff",
            id="kube imports publish",
        ),
        pytest.param(
            "claims/status/status_writer.py",
            "from dra_driver.publish.workqueue import WorkQueue",
            ("kube-edge-below-publish",),
            "dra_driver.claims.status.status_writer -> dra_driver.publish.workqueue",
            id="claims import publish",
        ),
        pytest.param(
            "observability/metrics.py",
            "from dra_driver.claims.errors import ClaimRejected",
            ("metrics-vocabulary", "layers"),
            "dra_driver.observability.metrics -> dra_driver.claims.errors",
            id="metrics import an error type",
        ),
        pytest.param(
            # What observability/logs.py did before issue 31, for LogFormat.
            "observability/logs.py",
            "from dra_driver.config.settings import NodeSettings",
            ("layers",),
            "dra_driver.observability.logs -> dra_driver.config.settings",
            id="observability imports the option layer",
        ),
        pytest.param(
            # What kube/kubeconfig_choice.py did before issue 31: a circle with config/settings.py,
            # hidden there by a function-level import.
            "kube/kubeconfig_choice.py",
            "from dra_driver.config.option_values import SettingsError",
            ("layers",),
            "dra_driver.kube.kubeconfig_choice -> dra_driver.config.option_values",
            id="kube imports the option layer",
        ),
        pytest.param(
            # What kube/kube_api.py did before issue 31's own HTTP client.
            "kube/kube_api.py",
            "from kubernetes.aio.client.rest import RESTClientObject",
            ("lean-api-client",),
            "dra_driver.kube.kube_api -> kubernetes",
            id="the agent's client imports the official one",
        ),
        pytest.param(
            "agent/node_watch.py",
            "import aiohttp",
            ("lean-api-client",),
            "dra_driver.agent.node_watch -> aiohttp",
            id="the agent imports aiohttp",
        ),
        pytest.param(
            "claims/edits/gpu_edits.py",
            "from dra_driver.claims.sharing.sharing import SharingPlan",
            ("claims-groups",),
            "dra_driver.claims.edits.gpu_edits -> dra_driver.claims.sharing.sharing",
            id="claims edits import sharing",
        ),
        pytest.param(
            "claims/claim_plan.py",
            "from dra_driver.claims.status.device_status import StatusUpdate",
            ("claims-groups",),
            "dra_driver.claims.claim_plan -> dra_driver.claims.status.device_status",
            id="the claim reading imports status",
        ),
        pytest.param(
            # Both read the device model; neither may read the other.
            "claims/claim_plan.py",
            "from dra_driver.packing.shapes import PodShape",
            ("layers",),
            "dra_driver.claims.claim_plan -> dra_driver.packing.shapes",
            id="siblings import each other",
        ),
    ],
)
def test_a_bad_import_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, contracts: tuple[str, ...], reported: str
) -> None:
    shutil.copytree(
        REPOSITORY / "dra_driver", tmp_path / "dra_driver", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "dra_driver" / module
    target.write_text(f"{target.read_text()}\n{bad_import}\n")

    done = lint_imports(tmp_path)

    names = contract_names()
    assert done.returncode == 1, done.stdout + done.stderr
    expected = {name: "BROKEN" if key in contracts else "KEPT" for key, name in names.items()}
    assert verdicts(done.stdout) == expected, done.stdout
    assert reported in done.stdout


def test_a_package_without_a_layer_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(
        REPOSITORY / "dra_driver", tmp_path / "dra_driver", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "dra_driver" / "gadgets").mkdir()
    (tmp_path / "dra_driver" / "gadgets" / "__init__.py").write_text('"""Not placed in any layer."""\n')

    done = lint_imports(tmp_path)

    names = contract_names()
    assert done.returncode == 1, done.stdout + done.stderr
    expected = {name: "BROKEN" if key == "layers" else "KEPT" for key, name in names.items()}
    assert verdicts(done.stdout) == expected, done.stdout
    assert "dra_driver.gadgets" in done.stdout
