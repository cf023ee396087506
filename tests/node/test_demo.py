"""`dra-driver demo`, the README's first command, end to end."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.tools import podman


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_shows_the_whole_flow_without_a_container() -> None:
    result = run_demo("--no-container")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    for section in (
        "devices node demo-node publishes (simulated profile dgx-h100: 8x NVIDIA H100 80GB HBM3)",
        "kubelet registration handshake",
        "NodePrepareResources (v1) answer",
        "CDI spec ",
        "container run skipped",
        "NodeUnprepareResources (v1) answer",
    ):
        assert f"=== {section}" in out
    assert "k8s.gpu.dra-driver.dev/claim=3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17-gpu-0" in out
    assert "disabled with --no-container" in out


def need_podman() -> None:
    if problem := podman.podman_problem():
        if os.environ.get("DRA_DRIVER_REQUIRE_PODMAN") == "1":
            pytest.fail(f"DRA_DRIVER_REQUIRE_PODMAN=1 but {problem}")
        pytest.skip(problem)


def test_demo_leaves_the_hosts_cdi_directories_alone_unless_asked() -> None:
    need_podman()

    result = run_demo("--hardware", "simulated:l4x8")

    assert result.returncode == 0, result.stderr
    (spec_line,) = [line for line in result.stdout.splitlines() if line.startswith("=== CDI spec ")]
    spec_path = Path(spec_line.removeprefix("=== CDI spec ").removesuffix(" ==="))
    assert spec_path.parent not in podman.CDI_DIRS
    assert not spec_path.exists()
    skipped = result.stdout.split("=== container run skipped ===")[1]
    assert "private directory, which podman does not read; --cdi-dir /var/run/cdi writes it" in skipped


def test_demo_runs_a_container_when_asked_to_write_where_podman_reads() -> None:
    need_podman()

    result = run_demo("--hardware", "simulated:l4x8", "--cdi-dir", str(podman.CDI_DIRS[1]))

    assert result.returncode == 0, result.stderr
    container_part = result.stdout.split(
        "=== what a container started with these CDI devices sees (podman) ==="
    )[1]
    assert "DRA_DEVICE_GPU_0_PRODUCT_NAME=NVIDIA L4" in container_part
    # Unprepare removed the spec the demo wrote into podman's CDI directory.
    assert not list(podman.CDI_DIRS[1].glob("k8s.gpu.dra-driver.dev-claim_3f9c1e52-*"))


def test_demo_refuses_a_bad_claim_file() -> None:
    result = run_demo("--claim-file", "/nonexistent/claims.yaml", "--no-container")

    assert result.returncode == 2
    assert result.stderr.startswith("dra-driver demo: --claim: claim file /nonexistent/claims.yaml: ")


def section(out: str, title: str) -> Any:
    """The YAML of the section whose title starts with `title`, up to the next section."""
    after_title = out.split(f"=== {title}", 1)[1].split(" ===\n", 1)[1]
    return yaml.safe_load(after_title.split("\n=== ")[0])


@pytest.mark.parametrize(
    ("kind", "profile"),
    [
        ("gpu", "l4x8"),
        ("gpu", "mixed"),
        ("mig", "dgx-h100-mig"),  # dynamic MIG, through the node config the demo writes
        ("mig", "mixed"),  # the static instances the node has
        ("vgpu", "l4x8"),
        ("vgpu", "mixed"),
    ],
)
def test_the_sample_claim_of_each_kind_is_prepared_on_a_node_that_offers_it(kind: str, profile: str) -> None:
    result = run_demo("--claim", kind, "--hardware", f"simulated:{profile}", "--no-container")

    assert result.returncode == 0, result.stderr
    offered = {
        device["name"]: device["attributes"]["type"]["string"]
        for device in section(result.stdout, "devices node demo-node publishes")
    }
    (entry,) = section(result.stdout, "NodePrepareResources (v1) answer")["claims"].values()
    assert entry["error"] == ""
    (prepared,) = entry["devices"]
    assert offered[prepared["device_name"]] == kind
    assert "=== CDI spec " in result.stdout


def test_a_claim_the_node_cannot_prepare_exits_1(tmp_path: Path) -> None:
    """A whole-GPU claim for gpu-0 on a node whose GPU 0 is in MIG mode."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": "wrong", "uid": "0b5e7c3a-1d2f-4a6b-8c9d-2e4f6a8b0c1d"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-driver.dev"}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.dra-driver.dev",
                            "pool": "demo-node",
                            "device": "gpu-0",
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"}],
        },
    }
    claim_file = tmp_path / "claim.yaml"
    claim_file.write_text(yaml.safe_dump(claim))

    result = run_demo("--claim", str(claim_file), "--hardware", "simulated:mixed", "--no-container")

    assert result.returncode == 1
    assert "dra-driver demo: claim 0b5e7c3a-1d2f-4a6b-8c9d-2e4f6a8b0c1d was not prepared: " in result.stderr
    assert "=== NodeUnprepareResources (v1) answer" in result.stdout


def test_a_relative_cdi_dir_is_invalid_input() -> None:
    result = run_demo("--cdi-dir", "cdi", "--no-container")

    assert result.returncode == 2
    assert result.stderr == "dra-driver demo: --cdi-dir: 'cdi' must be an absolute path\n"


def test_demo_runs_an_examples_own_file() -> None:
    """The natural first try: the example's template and pod, allocated by the demo itself."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "gpu-whole.yaml"
    result = run_demo("--claim", str(example), "--no-container")

    assert result.returncode == 0, result.stderr
    assert "the allocated claim (as the scheduler leaves it)" in result.stdout
    assert "resourceClaimTemplateName" not in result.stdout
