"""The GPU check without a GPU: CDI edits applied for real in a private mount namespace, and the
whole flow up to the CUDA workload (agent, prepare, host paths, a stand-in workload under each
claim's edits, unprepare, report) against the mock libnvidia-ml.so.1."""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from tests.support.agent import NODE_NAME
from tests.support.gpu_check.__main__ import main
from tests.support.gpu_check.cdi_apply import edits_for
from tests.support.gpu_check.namespace import start_under_edits
from tests.support.gpu_check.steps import gpu_steps
from tests.support.mock_nvml import LIBRARY_DIR, MockNode, make_driver_root

NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="unshare -m needs root"
)
# What a workload under the edits reports: its environment and what it finds at a path.
# With LOAD_NVML=1 it loads libnvidia-ml.so.1 by its SONAME, as nvidia-ml-py does, and reports
# where its loader found it, as the CUDA workload reports its driver libraries.
STANDIN = """\
import ctypes, hashlib, json, os, sys, time
from pathlib import Path
seen = Path(os.environ.get("LOOK_AT", "/nonexistent"))
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_", "MARK"))}
digest = hashlib.sha256(seen.read_bytes()).hexdigest() if seen.is_file() else None
out = {"pid": os.getpid(), "visible": 1, "env": env, "sha256": digest, "writable": os.access(seen, os.W_OK)}
if os.environ.get("LOAD_NVML") == "1":
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as error:
        out["error"] = str(error)
    maps = {line.split(maxsplit=5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    out["driver_libraries"] = sorted(p for p in maps if "libnvidia-ml.so" in p)
hold = os.environ.get("GPU_CHECK_HOLD")
if hold:
    Path(hold + ".ready").write_text(str(os.getpid()))
    deadline = time.monotonic() + 20
    while not Path(hold + ".go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
print(json.dumps(out))
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def spec(host: Path, target: Path) -> dict[str, object]:
    edits = {
        "env": ["MARK=inside"],
        "mounts": [
            {"hostPath": str(host), "containerPath": str(target), "options": ["ro", "nosuid", "bind"]}
        ],
    }
    return {
        "cdiVersion": "0.5.0",
        "kind": "example.com/test",
        "devices": [{"name": "d", "containerEdits": edits}],
    }


def run_standin(tmp_path: Path, host: Path, target: Path) -> dict[str, object]:
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    edits = edits_for([spec(host, target)], ["example.com/test=d"])
    running = start_under_edits(
        edits, [sys.executable, str(script)], dict(os.environ), {"LOOK_AT": str(target)}
    )
    code, stdout, stderr = running.finish(30)
    assert code == 0, stderr
    result: dict[str, object] = json.loads(stdout)
    return result


@NEEDS_ROOT
def test_a_spec_mount_and_variable_apply_inside_and_leave_the_host_as_it_was(tmp_path: Path) -> None:
    host = tmp_path / "host.txt"
    host.write_text("from the spec")
    target = tmp_path / "target.txt"
    target.write_text("the host's own")

    inside = run_standin(tmp_path, host, target)

    assert inside["sha256"] == sha256(b"from the spec")
    assert inside["writable"] is False  # bound read-only
    assert inside["env"] == {"MARK": "inside"}
    assert target.read_text() == "the host's own"


@NEEDS_ROOT
def test_a_missing_mount_target_is_made_for_the_run_and_removed_after(tmp_path: Path) -> None:
    host = tmp_path / "host.txt"
    host.write_text("from the spec")
    target = tmp_path / "made" / "for" / "it.txt"

    inside = run_standin(tmp_path, host, target)

    assert inside["sha256"] == sha256(b"from the spec")
    assert not (tmp_path / "made").exists()


@NEEDS_ROOT
def test_the_whole_check_on_the_mock_up_to_the_cuda_workload(tmp_path: Path) -> None:
    node = MockNode.create(tmp_path / "mock", NODE_NAME, "dgx-h100")
    driver = make_driver_root(tmp_path / "driver", DEFAULT_DRIVER_VERSION)
    (tmp_path / "standin.py").write_text(STANDIN)
    library = f"/{LIBRARY_DIR}/libnvidia-ml.so.1"
    out = tmp_path / "out"
    workload = f"env LOOK_AT={library} LOAD_NVML=1 {sys.executable} {tmp_path}/standin.py"
    args = ["--out", str(out), "--workload", workload]
    # The steps that need a real GPU: its settings, the real-NVML suite, usage of a real process,
    # and the MPS phase (its daemon is the driver's nvidia-cuda-mps-control, which needs the GPU).
    real_gpu = ("settings_before", "contract_suite", "whole.usage", "settings_after")
    for step in (*real_gpu, *(step.name for step in gpu_steps() if step.name.startswith("mps."))):
        args += ["--skip", step]
    for arg in ("--driver-root", str(driver), "--sysfs-root", str(node.sysfs), "--proc-root", str(node.proc)):
        args.append(f"--agent-arg={arg}")
    args += [f"--agent-env={name}={value}" for name, value in node.environment().items()]

    scratch_before = set(Path("/tmp").glob("gc-*"))
    code = main(args)

    assert set(Path("/tmp").glob("gc-*")) == scratch_before, "the run's scratch directory is removed"
    report = json.loads((out / "report.json").read_text())
    checks = {c["name"]: c for step in report["steps"] for c in step["checks"]}
    assert code == 1  # the mock node has no /dev/nvidia*: the host-path check says so
    failed = {name: c["numbers"]["missing"] for name, c in checks.items() if c["status"] == "fail"}
    missing = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert failed == {
        "every host path of the whole claim's CDI specs exists": missing,
        "every host path of the vgpu claim's CDI specs exists": missing,
    }
    whole = checks["CUDA workload under the whole claim's CDI edits"]["numbers"]
    vgpu = checks["CUDA workload under the vgpu claim's CDI edits"]["numbers"]
    # The workload found the mock's NVML bound at its SONAME path, and the share's limits.
    mock_library = Path(driver, LIBRARY_DIR, "libnvidia-ml.so.1").read_bytes()
    assert whole["sha256"] == vgpu["sha256"] == sha256(mock_library)
    assert vgpu["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert vgpu["env"]["CUDA_DEVICE_SM_LIMIT_0"] == "25"
    # With the host's loader cache hidden, the loader found the mock's NVML only through the
    # claim's mount into its built-in directory (the host has none there).
    loader = checks["the driver's libraries load from the claim's mounts, the host's loader cache hidden"]
    assert loader["status"] == "pass", loader
    assert loader["numbers"]["driver_libraries"] == [library]
    assert checks["vGPU memory limit"]["status"] == "skip"
    assert "no HAMi-core library" in checks["vGPU memory limit"]["detail"]
    for name in ("prepare (whole)", "prepare (vgpu)", "unprepare (whole)", "unprepare (vgpu)"):
        assert checks[name]["status"] == "pass", checks[name]
    assert "verdict: FAIL" in (out / "report.txt").read_text()
    assert not Path(library).exists() or Path(library).stat().st_size > 0  # no empty mount point left
