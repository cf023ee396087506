"""`dra-driver demo`, the README's first command, end to end."""

import os
import subprocess
import sys

import pytest

from dra_driver import podman


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


def test_demo_runs_a_container_when_podman_works() -> None:
    if problem := podman.podman_problem():
        if os.environ.get("DRA_DRIVER_REQUIRE_PODMAN") == "1":
            pytest.fail(f"DRA_DRIVER_REQUIRE_PODMAN=1 but {problem}")
        pytest.skip(problem)

    result = run_demo("--hardware", "simulated:l4x8")

    assert result.returncode == 0, result.stderr
    container_part = result.stdout.split(
        "=== what a container started with these CDI devices sees (podman) ==="
    )[1]
    assert "DRA_DEVICE_GPU_0_PRODUCT_NAME=NVIDIA L4" in container_part
    # Unprepare removed the spec the demo wrote into podman's CDI directory.
    assert not list(podman.CDI_DIRS[1].glob("k8s.gpu.dra-driver.dev-claim_3f9c1e52-*"))


def test_demo_refuses_a_bad_claim_file() -> None:
    result = run_demo("--claim-file", "/nonexistent/claims.yaml", "--no-container")

    assert result.returncode == 1
    assert result.stderr.startswith("dra-driver demo: claim file /nonexistent/claims.yaml: ")
