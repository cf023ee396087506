"""vGPU shares under vgpu.enforcement mps, with real simulated MPS control daemons: one daemon
per GPU, shared by every share on it, each share's containers with limits of their own."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claims.calls import RawClaim
from dra_driver.claims.effect_entries import GpuMpsEntry
from dra_driver.claims.engine import GPU_MPS_CHANGES, ClaimEngine, SharingControls
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.sharing import gpu_mps_daemons
from dra_driver.claims.sharing.gpu_mps_daemons import GpuMpsDaemons
from dra_driver.claims.sharing.mps import (
    PID_FILE,
    SIMULATED_SETTINGS_FILE,
    MpsControlDaemons,
    SimulatedMps,
    daemon_pid,
    wait_until,
)
from dra_driver.claims.sharing.sharing import MpsDirectories, gpu_daemon_key, gpu_daemon_spec
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware import simulated_mps_control
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from dra_driver.observability.metrics import ClaimMetrics
from dra_driver.state.change_counters import ChangeCounters
from dra_driver.state.shared_locks import ClaimLocks
from tests.support.engines import simulated_engine
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import simulated_node
from tests.support.processes import process_alive

PROFILE = "t4x4"
MPS = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="mps"))
GPU = simulated_node(PROFILE)[0]
SHARES = ("3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10", "8d2e4b61-0a3f-4c5d-9e7f-1b2c3d4e5f60")


@pytest.fixture
def runtime_dir(short_dir: Path) -> Iterator[Path]:
    """Reachable by a client of another user (the queueing test); every daemon left is stopped."""
    short_dir.chmod(0o755)
    yield short_dir / "mps"
    for pid_file in (short_dir / "mps").glob(f"*/pipe/{PID_FILE}"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def share(claims: MemoryClaims, name: str, memory: str, cores: str, share_id: str) -> RawClaim:
    capacity = {"memory": memory, "cores": cores}
    return claims.add(name, {"device": "gpu-0", "shareID": share_id, "consumedCapacity": capacity})


def engine_for(
    tmp: Path, claims: MemoryClaims, runner: MpsControlDaemons, metrics: ClaimMetrics
) -> ClaimEngine:
    sharing = SharingControls(SimulatedTimeSlicer(gpu.uuid for gpu in simulated_node(PROFILE)), runner)
    return simulated_engine(tmp, claims, PROFILE, MPS, sharing=sharing, metrics=metrics)


def container_env(tmp: Path, claim: RawClaim) -> dict[str, str]:
    """The claim's CDI env, with the pipe directory as the host path the container has it at."""
    (spec_file,) = (tmp / "cdi").glob(f"*{claim.uid}*")
    spec = json.loads(spec_file.read_text())
    edits = [edits for device in spec["devices"] for edits in [device["containerEdits"]]]
    env = dict(item.split("=", 1) for edit in edits for item in edit.get("env", []))
    mounts = {m["containerPath"]: m["hostPath"] for edit in edits for m in edit.get("mounts", [])}
    env["CUDA_MPS_PIPE_DIRECTORY"] = mounts[env["CUDA_MPS_PIPE_DIRECTORY"]]
    return env


# The system's Python, which another user may run (the agent's may live in root's home).
SYSTEM_PYTHON = Path("/usr/bin/python3")


def run_client(env: dict[str, str], user: int | None = None) -> subprocess.CompletedProcess[str]:
    """A CUDA program of the claim's container, played by the simulated control program (it
    needs only the standard library). Another user gets a copy of the program: the checkout may
    be where only its owner can read (a clone under `mktemp -d`)."""
    if user is None:
        command = [sys.executable, "-m", simulated_mps_control.MODULE, "--client"]
        return subprocess.run(
            command,
            env={**env, "PYTHONPATH": str(Path(simulated_mps_control.__file__).parents[2])},
            capture_output=True,
            text=True,
            check=False,
        )
    with tempfile.TemporaryDirectory() as readable:
        Path(readable).chmod(0o755)
        program = Path(shutil.copy(simulated_mps_control.__file__, readable))
        program.chmod(0o644)
        command = [str(SYSTEM_PYTHON), str(program), "--client"]
        return subprocess.run(command, env=env, user=user, capture_output=True, text=True, check=False)


def daemon_settings(runtime_dir: Path) -> dict[str, Any]:
    pipe = MpsDirectories(runtime_dir, gpu_daemon_key(GPU.uuid)).pipe
    settings: dict[str, Any] = json.loads((pipe / SIMULATED_SETTINGS_FILE).read_text())
    return settings


def entries(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir()) if directory.exists() else []


def gone(pid: int) -> bool:
    """Whether the process ended (a zombie of ours is reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return not process_alive(pid)


def gauge(metrics: ClaimMetrics) -> float | None:
    return metrics.registry.get_sample_value("dra_driver_gpu_mps_daemon_up", {"gpu": GPU.uuid})


async def test_two_shares_of_one_gpu_get_their_own_limits_through_one_daemon(
    tmp_path: Path, runtime_dir: Path
) -> None:
    claims = MemoryClaims()
    first = share(claims, "a", "8Gi", "25", SHARES[0])
    second = share(claims, "b", "4Gi", "50", SHARES[1])
    metrics = ClaimMetrics()

    engine = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), metrics)
    await engine.load_state()
    outcomes = await engine.prepare([first, second])
    assert [outcome.error for outcome in outcomes.values()] == ["", ""]
    assert entries(runtime_dir) == [gpu_daemon_key(GPU.uuid)]
    assert gauge(metrics) == 1

    for claim in (first, second):
        assert run_client(container_env(tmp_path, claim)).returncode == 0
    settings = daemon_settings(runtime_dir)
    assert settings["visible_devices"] == GPU.uuid
    assert [(c["active_thread_percentage"], c["pinned_device_mem_limit"]) for c in settings["clients"]] == [
        (25, "0=8192M"),
        (50, "0=4096M"),
    ]
    daemon = settings["pid"]

    assert await engine.unprepare([first]) == {first.uid: ""}
    assert daemon_settings(runtime_dir)["pid"] == daemon, "the other share still uses the daemon"
    assert await engine.unprepare([second]) == {second.uid: ""}
    assert entries(runtime_dir) == [], "the last share's unprepare stops the GPU's daemon"
    assert gauge(metrics) is None
    engine.close()


@pytest.mark.skipif(os.getuid() != 0 or not SYSTEM_PYTHON.exists(), reason="runs a client as another user")
async def test_a_client_of_another_user_waits_for_the_first_users_server(
    tmp_path: Path, runtime_dir: Path
) -> None:
    claims = MemoryClaims()
    first = share(claims, "a", "8Gi", "25", SHARES[0])
    second = share(claims, "b", "4Gi", "50", SHARES[1])

    engine = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), ClaimMetrics())
    await engine.load_state()
    await engine.prepare([first, second])
    assert run_client(container_env(tmp_path, first)).returncode == 0
    queued = run_client(container_env(tmp_path, second), user=65534)
    assert queued.returncode == 3
    assert queued.stdout.startswith(f"queued: the server of uid {os.getuid()} serves 1 clients")
    await engine.unprepare([first, second])
    engine.close()


async def test_a_daemon_that_died_shows_in_the_metric_at_start_and_the_next_prepare_restarts_it(
    tmp_path: Path, runtime_dir: Path
) -> None:
    claims = MemoryClaims()
    first = share(claims, "a", "8Gi", "25", SHARES[0])
    second = share(claims, "b", "4Gi", "50", SHARES[1])
    directories = MpsDirectories(runtime_dir, gpu_daemon_key(GPU.uuid))

    engine = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), ClaimMetrics())
    await engine.load_state()
    assert (await engine.prepare([first]))[first.uid].error == ""
    pid = daemon_pid(directories)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert await wait_until(lambda: gone(pid), 5, 0.01)
    engine.close()

    metrics = ClaimMetrics()
    broken = engine_for(tmp_path, claims, MpsControlDaemons(runtime_dir, ["false"], {}), metrics)
    await broken.load_state()
    assert gauge(metrics) == 0, "start-up finds the GPU's daemon dead"
    error = (await broken.prepare([second]))[second.uid].error
    assert f"the MPS control daemon of GPU {GPU.uuid}, which enforces its vGPU shares" in error
    assert "the next prepare on this GPU tries again" in error
    assert gauge(metrics) == 0 and first.uid in broken.prepared_claims
    broken.close()

    restarted = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), metrics)
    await restarted.load_state()
    assert (await restarted.prepare([second]))[second.uid].error == ""
    assert daemon_pid(directories) not in (None, pid)
    assert gauge(metrics) == 1
    await restarted.unprepare([first, second])
    restarted.close()


async def test_a_daemon_that_cannot_start_fails_the_prepare_clearly_and_leaves_nothing(
    tmp_path: Path, runtime_dir: Path
) -> None:
    claims = MemoryClaims()
    claim = share(claims, "a", "8Gi", "25", SHARES[0])
    metrics = ClaimMetrics()

    async def scenario() -> str:
        engine = engine_for(
            tmp_path, claims, MpsControlDaemons(runtime_dir, ["false"], dict(os.environ)), metrics
        )
        await engine.load_state()
        error = (await engine.prepare([claim]))[claim.uid].error
        assert claim.uid not in engine.prepared_claims
        assert not list((tmp_path / "state").glob("*.json"))
        engine.close()
        return error

    error = await scenario()
    assert f"the MPS control daemon of GPU {GPU.uuid}, which enforces its vGPU shares" in error
    assert "did not start" in error and "the next prepare on this GPU tries again" in error
    assert gauge(metrics) is None, "no share uses the GPU's daemon: it has no series"
    assert entries(runtime_dir) == []


async def test_a_share_past_the_mps_client_limit_is_refused_naming_the_limit(
    tmp_path: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_mps_daemons, "MPS_CLIENTS_PER_GPU", 1)
    claims = MemoryClaims()
    first = share(claims, "a", "8Gi", "25", SHARES[0])
    second = share(claims, "b", "4Gi", "50", SHARES[1])

    async def scenario() -> str:
        engine = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), ClaimMetrics())
        await engine.load_state()
        assert (await engine.prepare([first]))[first.uid].error == ""
        error = (await engine.prepare([second]))[second.uid].error
        assert daemon_pid(MpsDirectories(runtime_dir, gpu_daemon_key(GPU.uuid))) is not None, (
            "the refused share's rollback leaves the first share's daemon running"
        )
        await engine.unprepare([first])
        engine.close()
        return error

    error = await scenario()
    assert f"GPU {GPU.uuid} already has 1 prepared vGPU shares under vgpu.enforcement mps" in error
    assert "one MPS server takes at most 1 clients per GPU" in error


async def test_start_up_stops_the_daemon_of_a_gpu_no_share_uses(tmp_path: Path, runtime_dir: Path) -> None:
    claims = MemoryClaims()

    runner = SimulatedMps(runtime_dir)
    await runner.start(gpu_daemon_spec(runtime_dir, GPU.uuid))
    engine = engine_for(tmp_path, claims, runner, ClaimMetrics())
    await engine.load_state()
    assert entries(runtime_dir) == []
    engine.close()


async def test_of_the_last_two_shares_undone_together_the_second_stops_the_daemon(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """Two unprepares of a GPU's last shares, each deciding while the other's record is still on
    disk (records go only after the whole undo): the first takes its GPU out of its own record
    under the GPU's lock, so the second finds no other share and stops the daemon."""
    claims = MemoryClaims()
    first = share(claims, "a", "8Gi", "25", SHARES[0])
    second = share(claims, "b", "4Gi", "50", SHARES[1])
    store = ClaimRecordStore(tmp_path / "state")

    engine = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), ClaimMetrics())
    await engine.load_state()
    await engine.prepare([first, second])
    engine.close()
    locks = ClaimLocks(tmp_path / "other.locks")
    daemons = GpuMpsDaemons(
        SimulatedMps(runtime_dir),
        locks,
        store.read_all,
        store.write,
        lambda *_: None,
        ChangeCounters(tmp_path / "state" / GPU_MPS_CHANGES),
    )
    records = store.read_all()
    left = await daemons.detach(records[first.uid], GPU.uuid)
    assert (left.state, left.entries(GpuMpsEntry)) == ("preparing", ())
    assert store.read(first.uid) == left
    assert entries(runtime_dir) == [gpu_daemon_key(GPU.uuid)], "the second share still uses it"
    await daemons.detach(records[second.uid], GPU.uuid)
    assert entries(runtime_dir) == [], "no daemon outlives the GPU's last shares"
    locks.close()


async def test_a_share_another_agent_process_prepared_meanwhile_keeps_the_daemon_running(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """Each process counts a GPU's shares from memory, so one that learned them before a peer
    (the other pod of a rolling update) prepared another share must notice: the GPU's change
    counter moved, and it reads the records afresh before it decides to stop the daemon."""
    claims = MemoryClaims()
    first = share(claims, "a", "8Gi", "25", SHARES[0])
    second = share(claims, "b", "4Gi", "50", SHARES[1])
    store = ClaimRecordStore(tmp_path / "state")

    engine = engine_for(tmp_path, claims, SimulatedMps(runtime_dir), ClaimMetrics())
    await engine.load_state()
    await engine.prepare([first])
    locks = ClaimLocks(tmp_path / "state" / "claim.locks")
    peer = GpuMpsDaemons(
        SimulatedMps(runtime_dir),
        locks,
        store.read_all,
        store.write,
        lambda *_: None,
        ChangeCounters(tmp_path / "state" / GPU_MPS_CHANGES),
    )
    await peer.reconcile([GPU.uuid])  # the peer knows the GPU's one share
    await engine.prepare([second])
    await peer.detach(store.read_all()[first.uid], GPU.uuid)
    assert entries(runtime_dir) == [gpu_daemon_key(GPU.uuid)], "the share prepared meanwhile uses it"
    await engine.unprepare([second])
    assert entries(runtime_dir) == [], "the engine then counts the share the peer took out"
    locks.close()
    engine.close()
