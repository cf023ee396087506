"""The mock driver hack/kind-up.sh unpacks on the kind worker (tests/e2e/mock_driver.py), checked
without Docker: what its archive holds, and that the agent's NVML backend, given the archive's
files and the environment the e2e chart values set, finds exactly the GPUs the e2e examples were
checked against. The kind run itself needs Docker (docs/e2e.md); this keeps its setup from
rotting in between."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.hardware import simulated_mps_control
from dra_driver.hardware.driver_root import CONTROL_DEVICE_NODES
from dra_driver.hardware.simulated_nodes import resolve_node_spec
from tests.e2e import mock_driver
from tests.support.examples import (
    E2E_HARDWARE_FILE,
    E2E_NODE_CONFIG_FILE,
    REPOSITORY,
    e2e_node_gpus,
    e2e_node_inventory,
)
from tests.support.mock_nvml import LIBRARY_DIR, build_library, render_node

NODE = "dra-driver-worker"


@pytest.fixture(scope="module")
def members() -> dict[str, tarfile.TarInfo]:
    stream = BytesIO()
    mock_driver.archive(NODE, build_library(), stream)
    stream.seek(0)
    with tarfile.open(fileobj=stream) as tar:
        return {member.name: member for member in tar.getmembers()}


def test_the_archive_holds_the_driver_root_and_the_mocks_files_and_nothing_else(
    members: dict[str, tarfile.TarInfo],
) -> None:
    root = mock_driver.DRIVER_ROOT.lstrip("/")
    mock = mock_driver.MOCK_DIR.lstrip("/")

    outside = [
        name for name in members if name not in (root, mock) and not name.startswith((f"{root}/", f"{mock}/"))
    ]
    assert outside == []
    assert members[f"{root}/{LIBRARY_DIR}/libnvidia-ml.so.1"].issym()
    assert members[f"{root}/{LIBRARY_DIR}/libnvidia-ml.so.1"].linkname.startswith("libnvidia-ml.so.")
    for program in ("nvidia-smi", "nvidia-cuda-mps-control"):
        assert members[f"{root}/usr/bin/{program}"].mode & 0o111
    assert all(member.uid == 0 and member.gid == 0 for member in members.values())
    # make_sysfs links absolutely: the archive's links point where the files land on the worker.
    links = [member.linkname for member in members.values() if member.issym() and "/sys/bus/" in member.name]
    assert len(links) == len(e2e_node_gpus(NODE))
    assert all(link.startswith(f"{mock_driver.MOCK_DIR}/sys/devices/") for link in links)
    groups = [member.linkname for member in members.values() if member.name.endswith("/iommu_group")]
    assert len(groups) == len(e2e_node_gpus(NODE))
    assert all(link.startswith(f"{mock_driver.MOCK_DIR}/sys/kernel/iommu_groups/") for link in groups)


def test_every_device_node_a_cdi_spec_can_name_is_a_null_device_below_the_driver_root(
    members: dict[str, tarfile.TarInfo],
) -> None:
    """containerd stats a CDI device node's host path: each must exist on the worker."""
    nodes = {name: member for name, member in members.items() if member.ischr()}
    dev = f"{mock_driver.DRIVER_ROOT.lstrip('/')}/dev"
    gpus = e2e_node_gpus(NODE)
    # The mock's highest MIG capability minor: the last GPU, GPU instance 15, compute instance 7.
    highest = mock_driver.FIRST_GPU_CAPABILITY_MINOR + 256 * (len(gpus) - 1) + 16 * 15 + 1 + 7

    assert members[dev].isdir() and members[f"{dev}/nvidia-caps"].isdir()
    assert all((member.devmajor, member.devminor, member.mode) == (1, 3, 0o666) for member in nodes.values())
    assert {f"{mock_driver.DRIVER_ROOT.lstrip('/')}{path}" for path in CONTROL_DEVICE_NODES} <= set(nodes)
    assert {f"{dev}/nvidia{gpu.minor}" for gpu in gpus} <= set(nodes)
    assert {f"{dev}/nvidia-caps/nvidia-cap{minor}" for minor in (1, 2, highest)} <= set(nodes)


def test_the_mock_capability_minors_are_those_of_mock_nvml_c() -> None:
    source = (REPOSITORY / "tests" / "mock_nvml" / "mock_nvml.c").read_text()
    first, per_gpu = mock_driver.FIRST_GPU_CAPABILITY_MINOR, mock_driver.CAPABILITY_MINORS_PER_GPU

    assert f"{first}u + (unsigned)g * {per_gpu}u" in source
    assert "#define MAX_GI_IDS 16" in source and "#define MAX_CIS 8" in source


def inspect(node_config: Path, *options: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The devices `dra-driver inspect` shows for NODE."""
    command = [sys.executable, "-m", "dra_driver", "inspect", "--node-name", NODE, "--output", "yaml"]
    command += ["--node-config", str(node_config), *options]
    shown = subprocess.run(
        command, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    return [device for item in yaml.safe_load_all(shown.stdout) for device in item["spec"].get("devices", [])]


def test_the_agent_on_the_archives_files_finds_the_e2e_node(tmp_path: Path) -> None:
    """`dra-driver inspect --hardware nvml` on the mock, with the driver root and the environment
    the e2e installation gives the agent (moved below tmp_path), offers exactly the devices the
    simulated e2e node offers, which the examples were checked against."""
    mock_driver.lay_out(tmp_path, NODE, build_library())
    env = {name: f"{tmp_path}{value}" for name, value in mock_driver.mock_environment().items()}
    env["DRA_DRIVER_ROOT"] = f"{tmp_path}{mock_driver.DRIVER_ROOT}"

    on_mock = inspect(E2E_NODE_CONFIG_FILE, "--hardware", "nvml", env=env)

    node_file = tmp_path / mock_driver.MOCK_DIR.lstrip("/") / "node.txt"
    assert node_file.read_text() == render_node(NODE, resolve_node_spec(str(E2E_HARDWARE_FILE)))
    assert {device["name"] for device in on_mock} == {
        device.name for device in e2e_node_inventory(NODE).devices
    }
    assert on_mock == inspect(E2E_NODE_CONFIG_FILE, "--hardware", f"simulated:{E2E_HARDWARE_FILE}")


def test_the_nvidia_smi_stand_in_accepts_a_time_slice_and_refuses_the_rest(tmp_path: Path) -> None:
    program = tmp_path / "nvidia-smi"
    program.write_text(mock_driver.NVIDIA_SMI)
    program.chmod(0o755)
    checker = shutil.which("shellcheck")
    assert checker, "shellcheck is not installed: apt-get install shellcheck"

    assert subprocess.run([checker, str(program)], capture_output=True, check=False).returncode == 0
    uuid = e2e_node_gpus(NODE)[0].uuid
    accepted = [str(program), "compute-policy", "-i", uuid, "--set-timeslice=3"]
    assert subprocess.run(accepted, capture_output=True, check=False).returncode == 0
    assert subprocess.run([str(program), "-L"], capture_output=True, check=False).returncode == 1


def test_the_mock_is_built_with_the_flags_of_make_mock_nvml() -> None:
    makefile = (REPOSITORY / "Makefile").read_text()
    dockerfile = (REPOSITORY / "hack" / "e2e-node" / "mock-nvml.Dockerfile").read_text()
    flags = re.compile(r"\bg?cc (?P<flags>-std=\S+ .*?-Wl,-soname,libnvidia-ml\.so\.1) -o ")

    made, built = flags.search(makefile), flags.search(dockerfile)
    assert made and built
    assert made["flags"] == built["flags"]
    assert dockerfile.count("FROM ") == 1
    assert "FROM python:3.11-slim\n" in dockerfile
    assert "FROM python:3.11-slim" in (REPOSITORY / "Dockerfile").read_text(), "the agent's base image"


def test_kind_up_unpacks_the_mock_on_each_worker_before_installing() -> None:
    script = (REPOSITORY / "hack" / "kind-up.sh").read_text()
    unpack = script.index("-m tests.e2e.mock_driver archive --node-name")

    assert '--file "$repo_root/hack/e2e-node/mock-nvml.Dockerfile" "$repo_root/tests/mock_nvml"' in script
    assert 'docker exec --interactive "$node" tar -x -f - -C /' in script
    assert unpack < script.index('helm upgrade --install "$release"')


def test_the_mps_control_stand_in_runs_the_simulated_daemon(tmp_path: Path) -> None:
    """The vGPU example's shares are under MPS enforcement: the e2e node's daemon is the
    simulated nvidia-cuda-mps-control, which the agent's image carries."""
    program = tmp_path / "nvidia-cuda-mps-control"
    program.write_text(mock_driver.NVIDIA_CUDA_MPS_CONTROL)
    checker = shutil.which("shellcheck")
    assert checker, "shellcheck is not installed: apt-get install shellcheck"

    assert subprocess.run([checker, str(program)], capture_output=True, check=False).returncode == 0
    assert f"python3 -m {simulated_mps_control.MODULE} " in mock_driver.NVIDIA_CUDA_MPS_CONTROL
