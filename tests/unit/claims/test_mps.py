"""MPS control daemons with real processes: the simulated daemon, and nvidia-cuda-mps-control
played by a shell script that records how it was called."""

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dra_driver.claims.identity import InvalidClaimIdentity
from dra_driver.claims.opaque_config import MpsSettings, Sharing
from dra_driver.claims.sharing.mps import (
    PID_FILE,
    SIMULATED_SETTINGS_FILE,
    MpsControlDaemons,
    NvidiaMps,
    SimulatedMps,
    private_shm_argv,
)
from dra_driver.claims.sharing.sharing import MIB, MpsDaemonSpec, MpsDirectories, SharedDevice, plan_sharing
from dra_driver.hardware.driver_root import discover_driver
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.time_slicing import SYSTEM_PATH
from tests.support.processes import process_state

CLAIM = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
OTHER_CLAIM = "6a0e1c2b-3d4f-4a5b-8c6d-7e8f9a0b1c2d"
GPUS = ("GPU-0000000a-aaaa-bbbb-cccc-dddddddddddd", "GPU-0000000b-aaaa-bbbb-cccc-dddddddddddd")
VERSION = "580.95.05"


def spec_for(daemons: MpsControlDaemons, claim_uid: str = CLAIM) -> MpsDaemonSpec:
    """The spec sharing plans for a claim of two whole GPUs with MPS limits."""
    settings = Sharing("MPS", None, MpsSettings(30, 2048 * MIB, {"1": 1024 * MIB}))
    devices = [SharedDevice(f"gpu-{index}", "gpu", uuid, settings) for index, uuid in enumerate(GPUS)]
    spec = plan_sharing(claim_uid, devices, daemons.runtime_dir).mps
    assert spec is not None
    return spec


def daemon_pid(spec: MpsDaemonSpec) -> int:
    return int((spec.directories.pipe / PID_FILE).read_text())


async def stop_all(daemons: MpsControlDaemons) -> None:
    for claim_uid in daemons.claim_uids():
        await daemons.stop(claim_uid)


@pytest.fixture
def runtime_dir(short_dir: Path) -> Path:
    """Short, for the daemon's unix socket."""
    return short_dir / "mps"


@pytest.fixture
async def simulated(runtime_dir: Path) -> AsyncIterator[SimulatedMps]:
    """Any daemon a test leaves running is stopped after it."""
    daemons = SimulatedMps(runtime_dir)
    yield daemons
    await stop_all(daemons)


# --- SimulatedMps -----------------------------------------------------------------------------------


async def test_start_runs_a_daemon_that_received_the_claims_settings(simulated: SimulatedMps) -> None:
    daemons = simulated
    spec = spec_for(daemons)

    await daemons.start(spec)

    pid = daemon_pid(spec)
    assert process_state(pid) is not None
    assert pid != os.getpid() and os.getppid() != pid
    assert await daemons.is_running(CLAIM)
    settings = json.loads((spec.directories.pipe / SIMULATED_SETTINGS_FILE).read_text())
    assert settings == {
        "pid": pid,
        "visible_devices": ",".join(GPUS),
        "pipe_directory": str(spec.directories.pipe),
        "log_directory": str(spec.directories.log),
        "active_thread_percentage": 30,
        "pinned_mem_limits": {GPUS[0]: "2048M", GPUS[1]: "1024M"},
        "commands": list(spec.control_commands()),
        "server_uid": None,  # no client yet
        "clients": [],
    }
    assert (spec.directories.log / "control.log").read_text().splitlines() == [
        f"Cmd:{command}" for command in spec.control_commands()
    ]
    assert spec.directories.shm.is_dir()


async def test_starting_again_keeps_the_running_daemon(simulated: SimulatedMps) -> None:
    daemons = simulated
    spec = spec_for(daemons)
    await daemons.start(spec)
    first = daemon_pid(spec)

    await daemons.start(spec)

    assert daemon_pid(spec) == first
    assert process_state(first) is not None
    settings = json.loads((spec.directories.pipe / SIMULATED_SETTINGS_FILE).read_text())
    assert settings["commands"] == list(spec.control_commands())  # not applied twice


async def test_stop_ends_the_daemon_and_removes_its_directories_and_may_come_twice(
    simulated: SimulatedMps,
) -> None:
    daemons = simulated
    spec = spec_for(daemons)
    await daemons.start(spec)
    pid = daemon_pid(spec)

    await daemons.stop(CLAIM)

    assert process_state(pid) is None
    assert not spec.directories.root.exists()
    assert not await daemons.is_running(CLAIM)
    await daemons.stop(CLAIM)
    assert daemons.claim_uids() == set()


async def test_each_claim_has_its_own_daemon(simulated: SimulatedMps) -> None:
    daemons = simulated
    first, second = spec_for(daemons, CLAIM), spec_for(daemons, OTHER_CLAIM)
    await daemons.start(first)
    await daemons.start(second)
    assert daemon_pid(first) != daemon_pid(second)

    await daemons.stop(CLAIM)

    assert process_state(daemon_pid(second)) is not None
    assert daemons.claim_uids() == {OTHER_CLAIM}


async def test_a_restarted_agent_finds_the_daemon_and_stops_it(simulated: SimulatedMps) -> None:
    spec = spec_for(simulated)
    await simulated.start(spec)
    pid = daemon_pid(spec)

    after_restart = SimulatedMps(simulated.runtime_dir)
    assert after_restart.claim_uids() == {CLAIM}
    assert await after_restart.is_running(CLAIM)
    await after_restart.stop(CLAIM)

    assert process_state(pid) is None
    assert not spec.directories.root.exists()


async def test_a_daemon_that_died_is_replaced_by_start_and_cleaned_up_by_stop(
    simulated: SimulatedMps,
) -> None:
    daemons = simulated
    spec = spec_for(daemons)
    await daemons.start(spec)
    crashed = daemon_pid(spec)
    os.kill(crashed, signal.SIGKILL)  # the test's own daemon, killed as a crash would
    for _ in range(500):
        if process_state(crashed) is None:
            break
        await asyncio.sleep(0.01)

    mounted = {path: path.stat().st_ino for path in (spec.directories.pipe, spec.directories.shm)}
    (spec.directories.shm / "cuda.shm.0.1.1").write_text("left by the server that died")

    assert not await daemons.is_running(CLAIM)
    await daemons.start(spec)
    assert daemon_pid(spec) != crashed
    assert await daemons.is_running(CLAIM)
    # Same directories, so containers that have them mounted reach the new daemon; emptied, logs kept.
    assert {path: path.stat().st_ino for path in mounted} == mounted
    assert list(spec.directories.shm.iterdir()) == []
    assert len((spec.directories.log / "control.log").read_text().splitlines()) == 2 * len(
        spec.control_commands()
    )
    await daemons.stop(CLAIM)
    assert not spec.directories.root.exists()


async def test_a_pid_file_naming_an_unrelated_process_is_not_trusted(simulated: SimulatedMps) -> None:
    daemons = simulated
    directories = MpsDirectories(daemons.runtime_dir, CLAIM)
    directories.pipe.mkdir(parents=True)
    # Popen returns at once; its poll() below is what tells the process was left alone.
    with subprocess.Popen(["sleep", "60"]) as unrelated:  # noqa: ASYNC220
        try:
            (directories.pipe / PID_FILE).write_text(f"{unrelated.pid}\n")

            assert not await daemons.is_running(CLAIM)
            await daemons.stop(CLAIM)

            assert unrelated.poll() is None  # neither told to quit nor waited for
            assert not directories.root.exists()
        finally:
            unrelated.kill()


@pytest.mark.parametrize("uid", ["../../etc", "..", "", CLAIM.upper(), f"{CLAIM}/pipe"])
async def test_a_bad_claim_uid_is_refused_before_any_path_is_built(simulated: SimulatedMps, uid: str) -> None:
    daemons = simulated

    for call in (daemons.stop(uid), daemons.is_running(uid)):
        with pytest.raises(InvalidClaimIdentity, match="is not a Kubernetes UID"):
            await call
    assert not daemons.runtime_dir.exists()


def test_only_claim_uids_count_as_daemon_directories(simulated: SimulatedMps) -> None:
    daemons = simulated
    runtime_dir = daemons.runtime_dir
    for name in ("lost+found", "not-a-uid", CLAIM.upper()):
        (runtime_dir / name).mkdir(parents=True)
    (runtime_dir / OTHER_CLAIM).touch()
    (runtime_dir / CLAIM).mkdir()

    assert daemons.claim_uids() == {CLAIM}
    assert SimulatedMps(runtime_dir / "missing").claim_uids() == set()


def test_a_runtime_dir_too_long_for_the_daemons_socket_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"too long: the daemon's socket .* 107 bytes"):
        SimulatedMps(tmp_path / ("x" * 80))


async def test_a_spec_for_another_runtime_dir_is_refused(runtime_dir: Path) -> None:
    spec = spec_for(SimulatedMps(runtime_dir / "elsewhere"))

    with pytest.raises(ValueError, match="is not under"):
        await SimulatedMps(runtime_dir).start(spec)
    assert not spec.directories.root.exists()


# --- NvidiaMps, with nvidia-cuda-mps-control played by a script ----------------------------------

# `-d`: log the call, start a "daemon" (a subshell that keeps the environment, so its PID file can
# be checked, and runs until told to quit) and write its PID where the real daemon does. Without
# `-d`: log stdin; "quit" stops the daemon; while the file `refuse` exists, settings are refused.
FAKE_CONTROL = """#!/bin/sh
log={log}
if [ "$1" = "-d" ]; then
    [ -e {root}/broken ] && {{ echo "cannot start: no devices" >&2; exit 2; }}
    printf 'start %s|%s|%s|%s|%s|%s\\n' "$*" "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_PIPE_DIRECTORY" \\
        "$CUDA_MPS_LOG_DIRECTORY" "$LD_PRELOAD" "$PATH" >> "$log"
    (while [ ! -e "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do sleep 0.02; done) </dev/null >/dev/null 2>&1 &
    echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
    exit 0
fi
input=$(cat)
printf 'stdin %s|%s\\n' "$input" "$CUDA_MPS_PIPE_DIRECTORY" >> "$log"
case "$input" in
    quit) touch "$CUDA_MPS_PIPE_DIRECTORY/quit" ;;
    set_*) [ -e {root}/refuse ] && {{ echo "invalid value" >&2; exit 1; }} ;;
esac
exit 0
"""


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    """A driver root with nvidia-cuda-mps-control, a script."""
    control = tmp_path / "usr/bin/nvidia-cuda-mps-control"
    control.parent.mkdir(parents=True)
    control.write_text(FAKE_CONTROL.format(log=tmp_path / "calls.log", root=tmp_path))
    control.chmod(0o755)
    return tmp_path


def nvidia_mps(driver_root: Path, runtime_dir: Path) -> NvidiaMps:
    return NvidiaMps(discover_driver(driver_root, "unknown"), runtime_dir, private_shm=False, timeout_s=5)


@pytest.fixture
async def fake_nvidia(driver_root: Path, runtime_dir: Path) -> AsyncIterator[NvidiaMps]:
    """Any daemon a test leaves running is stopped after it."""
    yield nvidia_mps(driver_root, runtime_dir)
    await stop_all(nvidia_mps(driver_root, runtime_dir))


def calls(driver_root: Path) -> list[str]:
    return (driver_root / "calls.log").read_text().splitlines()


async def test_nvidia_mps_starts_the_drivers_control_daemon_then_sets_its_defaults(
    driver_root: Path, runtime_dir: Path
) -> None:
    for library in ("cuda", "nvidia-ml"):
        path = driver_root / "usr/lib64" / f"lib{library}.so.{VERSION}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")  # the loader skips an empty file, with a warning on stderr
    daemons = nvidia_mps(driver_root, runtime_dir)
    spec = spec_for(daemons)

    await daemons.start(spec)

    pipe, log = spec.directories.pipe, spec.directories.log
    preload = (
        f"{driver_root}/usr/lib64/libnvidia-ml.so.{VERSION}:{driver_root}/usr/lib64/libcuda.so.{VERSION}"
    )
    assert calls(driver_root) == [
        f"start -d|{GPUS[0]},{GPUS[1]}|{pipe}|{log}|{preload}|{SYSTEM_PATH}:{driver_root}/usr/bin",
        f"stdin set_default_active_thread_percentage 30|{pipe}",
        f"stdin set_default_device_pinned_mem_limit {GPUS[0]} 2048M|{pipe}",
        f"stdin set_default_device_pinned_mem_limit {GPUS[1]} 1024M|{pipe}",
    ]
    assert await daemons.is_running(CLAIM)
    await stop_all(daemons)


async def test_nvidia_mps_stop_sends_quit_with_the_claims_pipe_directory(
    driver_root: Path, runtime_dir: Path
) -> None:
    spec = spec_for(nvidia_mps(driver_root, runtime_dir))
    await nvidia_mps(driver_root, runtime_dir).start(spec)
    pid = daemon_pid(spec)

    await nvidia_mps(driver_root, runtime_dir).stop(CLAIM)  # a new object, as after a restart

    assert calls(driver_root)[-1] == f"stdin quit|{spec.directories.pipe}"
    assert process_state(pid) is None
    assert not spec.directories.root.exists()
    await nvidia_mps(driver_root, runtime_dir).stop(CLAIM)
    assert calls(driver_root)[-1] == f"stdin quit|{spec.directories.pipe}"  # nothing sent the second time


async def test_a_refused_setting_stops_the_daemon_and_leaves_nothing(
    fake_nvidia: NvidiaMps, driver_root: Path
) -> None:
    (driver_root / "refuse").touch()
    daemons = fake_nvidia
    spec = spec_for(daemons)

    with pytest.raises(HardwareError) as error:
        await daemons.start(spec)

    assert str(error.value) == (
        f"the MPS control daemon for claim {CLAIM} refused 'set_default_active_thread_percentage 30' "
        "(exit status 1): invalid value"
    )
    assert calls(driver_root)[-1] == f"stdin quit|{spec.directories.pipe}"
    assert not spec.directories.root.exists()
    assert not await daemons.is_running(CLAIM)


async def test_a_daemon_that_cannot_start_is_reported_with_what_it_said(
    driver_root: Path, runtime_dir: Path
) -> None:
    (driver_root / "broken").touch()
    daemons = nvidia_mps(driver_root, runtime_dir)
    spec = spec_for(daemons)

    with pytest.raises(HardwareError, match=r"did not start \(.*nvidia-cuda-mps-control -d: exit status 2\)"):
        await daemons.start(spec)

    with pytest.raises(HardwareError, match="cannot start: no devices"):
        await daemons.start(spec)
    assert not spec.directories.root.exists()


def test_a_driver_root_without_the_control_program_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="nvidia-cuda-mps-control was not found in the driver root"):
        NvidiaMps(discover_driver(tmp_path, "unknown"), tmp_path / "mps")


def test_the_daemon_can_get_the_claims_shm_directory_as_its_dev_shm() -> None:
    argv = private_shm_argv(Path("/run/mps/claim/shm"), ["/usr/bin/nvidia-cuda-mps-control", "-d"])

    assert argv == [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        'mount --bind "$0" /dev/shm && exec "$@"',
        "/run/mps/claim/shm",
        "/usr/bin/nvidia-cuda-mps-control",
        "-d",
    ]
