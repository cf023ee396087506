"""Sharing plans (pure) and the two time slicers: in memory, and nvidia-smi played by a real script."""

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from dra_driver.claims.edits.cdi import ContainerEdits, Mount
from dra_driver.claims.identity import InvalidClaimIdentity
from dra_driver.claims.opaque_config import (
    MpsSettings,
    OpaqueConfigError,
    Sharing,
    TimeSlicingSettings,
)
from dra_driver.claims.sharing.sharing import (
    MIB,
    MpsDaemonSpec,
    MpsDirectories,
    PinnedMemoryLimit,
    RestorePlan,
    SharedDevice,
    SharingPlan,
    plan_sharing,
)
from dra_driver.devices.model import DeviceType
from dra_driver.hardware.driver_root import discover_driver
from dra_driver.hardware.model import HardwareError, HardwareErrorReason, TimeSliceInterval, TimeSliceSetting
from dra_driver.hardware.time_slicing import (
    SYSTEM_PATH,
    CommandResult,
    NvidiaSmiTimeSlicer,
    SimulatedTimeSlicer,
    listed_time_slice,
    run_command,
)
from tests.support.processes import process_alive

CLAIM_UID = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
RUNTIME = Path("/run/dra-driver/mps")
GPU = [f"GPU-{index:08x}-aaaa-bbbb-cccc-dddddddddddd" for index in range(12)]
MIG = [f"MIG-{index:08x}-5555-6666-7777-888888888888" for index in range(4)]
VERSION = "580.95.05"


def time_slicing(interval: TimeSliceInterval) -> Sharing:
    return Sharing("TimeSlicing", TimeSlicingSettings(interval), None)


def mps(
    percentage: int | None = None,
    default_limit: int | None = None,
    per_device: Mapping[str, int] | None = None,
) -> Sharing:
    return Sharing("MPS", None, MpsSettings(percentage, default_limit, per_device or {}))


def gpu(index: int, sharing: Sharing) -> SharedDevice:
    return SharedDevice(f"gpu-{index}", "gpu", GPU[index], sharing)


def mig(index: int, sharing: Sharing) -> SharedDevice:
    return SharedDevice(f"gpu-0-mig-1g10gb-{index}", "mig", GPU[0], sharing, mig_uuid=MIG[index])


def vgpu(index: int, sharing: Sharing) -> SharedDevice:
    return SharedDevice(f"gpu-{index}-vgpu-10gb-0", "vgpu", GPU[index], sharing)


def plan(*devices: SharedDevice) -> SharingPlan:
    return plan_sharing(CLAIM_UID, devices, RUNTIME)


# --- Time slicing plans ---------------------------------------------------------------------------


def test_a_whole_gpu_gets_the_interval_its_config_names_and_gets_default_back() -> None:
    planned = plan(gpu(3, time_slicing("Long")))

    assert planned == SharingPlan(time_slices=(TimeSliceSetting(GPU[3], "Long"),))
    assert planned.restore == RestorePlan(time_slices=(TimeSliceSetting(GPU[3], "Default"),))
    assert planned.container_edits == ContainerEdits()


def test_gpus_are_planned_in_natural_name_order() -> None:
    planned = plan(
        gpu(10, time_slicing("Short")), gpu(2, time_slicing("Medium")), gpu(9, time_slicing("Long"))
    )

    assert [setting.gpu_uuid for setting in planned.time_slices] == [GPU[2], GPU[9], GPU[10]]
    assert [setting.interval for setting in planned.time_slices] == ["Medium", "Long", "Short"]


def test_default_leaves_the_time_slice_alone_so_nothing_is_restored_either() -> None:
    planned = plan(gpu(0, time_slicing("Default")), gpu(1, Sharing()))

    assert planned == SharingPlan()
    assert planned.restore == RestorePlan()


def test_mig_devices_and_vgpus_keep_their_gpus_time_slice() -> None:
    planned = plan(mig(0, time_slicing("Default")), mig(1, Sharing()), vgpu(4, Sharing()))

    assert planned == SharingPlan()


@pytest.mark.parametrize(
    ("device", "kind"),
    [(mig(0, time_slicing("Short")), "MIG device"), (vgpu(4, time_slicing("Long")), "vGPU")],
)
def test_a_time_slice_for_part_of_a_shared_gpu_is_refused(device: SharedDevice, kind: str) -> None:
    with pytest.raises(
        OpaqueConfigError, match=f"cannot be set for a {kind}: .* whole GPU {device.gpu_uuid}"
    ):
        plan(gpu(1, time_slicing("Long")), device)


# --- MPS plans ------------------------------------------------------------------------------------


def test_mps_on_whole_gpus_one_daemon_for_the_claim_in_natural_order() -> None:
    planned = plan(gpu(10, mps(percentage=40)), gpu(2, mps(percentage=40)))

    directories = MpsDirectories(RUNTIME, CLAIM_UID)
    assert planned.time_slices == ()
    assert planned.mps == MpsDaemonSpec(
        directories, device_uuids=(GPU[2], GPU[10]), active_thread_percentage=40
    )
    assert planned.restore == RestorePlan(stop_mps=True)
    assert planned.mps.daemon_environment() == {
        "CUDA_VISIBLE_DEVICES": f"{GPU[2]},{GPU[10]}",
        "CUDA_MPS_PIPE_DIRECTORY": f"{RUNTIME}/{CLAIM_UID}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"{RUNTIME}/{CLAIM_UID}/log",
    }
    assert planned.mps.control_commands() == ("set_default_active_thread_percentage 40",)


def test_mps_container_edits_reach_the_claims_daemon() -> None:
    settings = mps(percentage=25, default_limit=2 * 1024 * MIB, per_device={"1": 1024 * MIB})
    planned = plan(gpu(0, settings), gpu(1, settings))

    assert planned.container_edits == ContainerEdits(
        env=(
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M,1=1024M",
        ),
        mounts=(
            Mount(f"{RUNTIME}/{CLAIM_UID}/pipe", "/tmp/nvidia-mps", ("rw", "nosuid", "nodev", "bind")),
            Mount(f"{RUNTIME}/{CLAIM_UID}/shm", "/dev/shm", ("rw", "nosuid", "nodev", "bind")),
        ),
    )


def test_mps_without_limits_exports_only_the_pipe_directory() -> None:
    planned = plan(gpu(0, mps()))

    assert planned.container_edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    assert planned.mps is not None
    assert planned.mps.control_commands() == ()


def test_pinned_limits_default_for_all_overridden_by_index_or_uuid() -> None:
    settings = mps(default_limit=4 * 1024 * MIB, per_device={"2": 512 * MIB, GPU[1]: 1536 * MIB})
    planned = plan(*(gpu(index, settings) for index in range(3)))

    assert planned.mps is not None
    assert planned.mps.pinned_memory_limits == (
        PinnedMemoryLimit(0, GPU[0], 4096),
        PinnedMemoryLimit(1, GPU[1], 1536),
        PinnedMemoryLimit(2, GPU[2], 512),
    )
    assert planned.mps.control_commands() == (
        f"set_default_device_pinned_mem_limit {GPU[0]} 4096M",
        f"set_default_device_pinned_mem_limit {GPU[1]} 1536M",
        f"set_default_device_pinned_mem_limit {GPU[2]} 512M",
    )
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M,1=1536M,2=512M" in planned.container_edits.env


def test_per_device_limits_alone_limit_only_the_devices_they_name() -> None:
    settings = mps(per_device={"1": 1024 * MIB})
    planned = plan(gpu(0, settings), gpu(1, settings))

    assert planned.mps is not None
    assert planned.mps.pinned_memory_limits == (PinnedMemoryLimit(1, GPU[1], 1024),)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=1024M" in planned.container_edits.env


def test_limits_round_down_to_whole_mebibytes() -> None:
    planned = plan(gpu(0, mps(default_limit=1536 * 1024 + 3 * MIB)))  # 1.5 MiB + 3 MiB

    assert planned.mps is not None
    assert planned.mps.pinned_memory_limits == (PinnedMemoryLimit(0, GPU[0], 4),)


def test_mps_on_mig_devices_serves_the_mig_uuids() -> None:
    settings = mps(per_device={MIG[3]: 5 * 1024 * MIB})
    planned = plan(mig(3, settings), mig(1, settings))

    assert planned.mps is not None
    assert planned.mps.device_uuids == (MIG[1], MIG[3])
    assert planned.mps.pinned_memory_limits == (PinnedMemoryLimit(1, MIG[3], 5120),)
    assert planned.time_slices == ()


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ((vgpu(1, mps()),), "MPS is not supported for a vGPU"),
        ((gpu(0, mps()), gpu(1, time_slicing("Long"))), "devices gpu-1 do not use MPS"),
        (
            (gpu(0, mps(percentage=10)), gpu(1, mps(percentage=20))),
            "gpu-0 and gpu-1 have different MPS settings",
        ),
        (
            (gpu(0, mps(per_device={"1": MIB})),),
            r"key '1' names no device of this claim; its devices are 0: gpu-0",
        ),
        ((gpu(0, mps(per_device={GPU[5]: MIB})),), f"key '{GPU[5]}' names no device"),
        ((mig(0, mps(per_device={GPU[0]: MIB})),), f"key '{GPU[0]}' names no device"),
        ((gpu(0, mps(per_device={"0": MIB, GPU[0]: 2 * MIB})),), "keys '0' and .* both name device gpu-0"),
        ((gpu(0, mps(default_limit=MIB - 1)),), "1048575 bytes; MPS takes limits in whole MiB"),
    ],
)
def test_mps_configs_that_cannot_be_honoured_are_refused(
    devices: Sequence[SharedDevice], message: str
) -> None:
    with pytest.raises(OpaqueConfigError, match=message):
        plan(*devices)


@pytest.mark.parametrize("uid", ["../../etc", "", "0B7C4D6E-1F2A-4B3C-8D9E-0A1B2C3D4E5F", CLAIM_UID + "/x"])
def test_an_unchecked_claim_uid_never_becomes_a_path(uid: str) -> None:
    with pytest.raises(InvalidClaimIdentity, match="is not a Kubernetes UID"):
        MpsDirectories(RUNTIME, uid)
    with pytest.raises(InvalidClaimIdentity):
        plan_sharing(uid, [gpu(0, mps())], RUNTIME)


def test_a_claim_without_mps_needs_no_directories() -> None:
    assert plan_sharing("not-a-uid", [gpu(0, time_slicing("Short"))], RUNTIME).mps is None


@pytest.mark.parametrize(("device_type", "mig_uuid"), [("mig", None), ("gpu", MIG[0]), ("vgpu", MIG[0])])
def test_only_mig_devices_carry_a_mig_uuid(device_type: DeviceType, mig_uuid: str | None) -> None:
    with pytest.raises(ValueError, match="MIG UUID"):
        SharedDevice("gpu-0", device_type, GPU[0], Sharing(), mig_uuid=mig_uuid)


# --- SimulatedTimeSlicer ----------------------------------------------------------------------------


async def test_simulated_time_slicer_remembers_each_gpus_interval_and_the_history() -> None:
    slicer = SimulatedTimeSlicer(GPU[:2])

    async def scenario() -> list[TimeSliceInterval]:
        await slicer.set_time_slice(GPU[1], "Long")
        await slicer.set_time_slice(GPU[1], "Default")
        await slicer.set_time_slice(GPU[0], "Short")
        return [await slicer.current(GPU[0]), await slicer.current(GPU[1])]

    assert await scenario() == ["Short", "Default"]
    assert slicer.history == (
        TimeSliceSetting(GPU[1], "Long"),
        TimeSliceSetting(GPU[1], "Default"),
        TimeSliceSetting(GPU[0], "Short"),
    )


async def test_simulated_time_slicer_knows_only_whole_gpus() -> None:
    slicer = SimulatedTimeSlicer(GPU[:1])

    with pytest.raises(HardwareError, match="no GPU with UUID MIG-") as error:
        await slicer.set_time_slice(MIG[0], "Long")
    assert error.value.reason is HardwareErrorReason.NOT_FOUND
    assert slicer.history == ()


async def test_simulated_time_slicer_injected_failures_change_nothing_and_add_up() -> None:
    slicer = SimulatedTimeSlicer(GPU[:1])
    slicer.fail_next(HardwareErrorReason.NO_PERMISSION)
    slicer.fail_next(HardwareErrorReason.GPU_LOST)

    async def attempt() -> HardwareErrorReason | None:
        try:
            await slicer.set_time_slice(GPU[0], "Medium")
        except HardwareError as error:
            return error.reason
        return None

    assert [await attempt() for _ in range(3)] == [
        HardwareErrorReason.NO_PERMISSION,
        HardwareErrorReason.GPU_LOST,
        None,
    ]
    assert slicer.history == (TimeSliceSetting(GPU[0], "Medium"),)
    assert await slicer.current(GPU[0]) == "Medium"


# --- NvidiaSmiTimeSlicer, with a real nvidia-smi stand-in ------------------------------------------


def fake_driver_root(root: Path, nvidia_smi: str, *, with_nvml: bool = False) -> Path:
    """A driver root with an nvidia-smi script, and NVML if asked; returns the file the script
    logs to. The NVML stand-in is an empty file: the loader skips it with a warning on stderr."""
    if with_nvml:
        library = root / "usr/lib/x86_64-linux-gnu" / f"libnvidia-ml.so.{VERSION}"
        library.parent.mkdir(parents=True)
        library.write_text("")
    program = root / "usr/bin/nvidia-smi"
    program.parent.mkdir(parents=True)
    calls = root / "calls.log"
    program.write_text(f"#!/bin/sh\nCALLS={calls}\n{nvidia_smi}")
    program.chmod(0o755)
    return calls


RECORDING = 'printf "%s|%s|%s|%s\\n" "$0" "$*" "$LD_PRELOAD" "$PATH" >> "$CALLS"\n'


async def test_nvidia_smi_gets_the_level_of_each_interval_and_the_drivers_nvml(tmp_path: Path) -> None:
    calls = fake_driver_root(tmp_path, RECORDING, with_nvml=True)
    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"))

    for interval in ("Default", "Short", "Medium", "Long"):
        await slicer.set_time_slice(GPU[7], interval)

    smi = f"{tmp_path}/usr/bin/nvidia-smi"
    preload = f"{tmp_path}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}"
    path = f"{SYSTEM_PATH}:{tmp_path}/usr/bin"
    assert calls.read_text().splitlines() == [
        f"{smi}|compute-policy -i {GPU[7]} --set-timeslice={level}|{preload}|{path}" for level in range(4)
    ]


async def test_nvidia_smi_failure_is_reported_with_its_stderr(tmp_path: Path) -> None:
    calls = fake_driver_root(
        tmp_path, RECORDING + 'echo "Insufficient Permissions" >&2\necho "ignored" \nexit 3\n'
    )
    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"))

    with pytest.raises(HardwareError) as error:
        await slicer.set_time_slice(GPU[1], "Short")
    assert str(error.value) == (
        f"setting the time slice of GPU {GPU[1]} to Short (nvidia-smi compute-policy --set-timeslice=1) "
        "failed with exit status 3: Insufficient Permissions"
    )
    assert len(calls.read_text().splitlines()) == 1


async def test_nvidia_smi_is_never_run_for_a_mig_device_or_an_option_lookalike(tmp_path: Path) -> None:
    calls = fake_driver_root(tmp_path, RECORDING)
    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"))

    for uuid in (MIG[0], "--help", GPU[0].upper()):
        with pytest.raises(HardwareError, match="is not the UUID of a whole GPU") as error:
            await slicer.set_time_slice(uuid, "Long")
        assert error.value.reason is HardwareErrorReason.INVALID_ARGUMENT
    assert not calls.exists()


async def test_a_hung_nvidia_smi_is_killed_at_the_timeout_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "smi.pid"
    fake_driver_root(tmp_path, f"sleep 60 &\necho $! > {pid_file}\nwait\n")
    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"), timeout_s=0.5)

    started = time.monotonic()
    with pytest.raises(HardwareError, match=r"did not finish within 0.5 s and was killed"):
        await slicer.set_time_slice(GPU[0], "Long")
    assert time.monotonic() - started < 10
    assert gone(int(pid_file.read_text()))


def gone(pid: int) -> bool:
    """Whether the process ends (or is a zombie: killed, not yet reaped) within a few seconds."""
    for _ in range(500):
        if not process_alive(pid):
            return True
        time.sleep(0.01)
    return False


async def test_current_time_slice_is_read_from_the_policy_list(tmp_path: Path) -> None:
    calls = fake_driver_root(tmp_path, RECORDING + 'echo "GPU  0: Timeslice: Medium"\n')
    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"))

    assert await slicer.current(GPU[2]) == "Medium"
    assert calls.read_text().split("|")[1] == f"compute-policy -i {GPU[2]} --list"


async def test_a_policy_list_without_one_time_slice_is_an_error(tmp_path: Path) -> None:
    fake_driver_root(tmp_path, 'echo "No compute policies"\n')
    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"))

    with pytest.raises(HardwareError, match="did not show one time slice: No compute policies"):
        await slicer.current(GPU[2])


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("GPU  0: Timeslice: Default\n", "Default"),
        ("GPU 00000000:1B:00.0\n    Timeslice : LONG\n", "Long"),
        ("Timeslice: 1\n", "Short"),
        ("GPU 0: Timeslice: Short\nGPU 1: Timeslice: Long\n", None),
        ("Timeslice: 4\n", None),
        ("", None),
    ],
)
def test_listed_time_slice(output: str, expected: TimeSliceInterval | None) -> None:
    assert listed_time_slice(output) == expected


def test_a_driver_root_without_nvidia_smi_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(
        HardwareError, match=f"nvidia-smi was not found in the driver root {tmp_path}"
    ) as error:
        NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"))
    assert error.value.reason is HardwareErrorReason.LIBRARY_NOT_FOUND


async def test_nvidia_smi_goes_through_the_runner_it_is_given(tmp_path: Path) -> None:
    fake_driver_root(tmp_path, "")
    seen: list[tuple[list[str], float]] = []

    async def logging_runner(
        argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float, stdin: str = ""
    ) -> CommandResult:
        seen.append((list(argv[1:]), timeout_s))
        return await run_command(argv, env=env, timeout_s=timeout_s, stdin=stdin)

    slicer = NvidiaSmiTimeSlicer(discover_driver(tmp_path, "unknown"), timeout_s=7, run=logging_runner)
    await slicer.set_time_slice(GPU[0], "Medium")

    assert seen == [(["compute-policy", "-i", GPU[0], "--set-timeslice=2"], 7)]


async def test_run_command_feeds_stdin_and_returns_both_streams() -> None:
    result = await run_command(
        ["/bin/sh", "-c", "cat; echo oops >&2; exit 5"], env={}, timeout_s=10, stdin="hello\n"
    )

    assert result == CommandResult(5, "hello\n", "oops\n")
    assert result.output() == "oops"


async def test_a_program_that_exits_without_reading_its_input_is_answered() -> None:
    """The MPS control program exits at once when no daemon serves its pipe directory, its command
    unread: its exit status and output come back, not the failed write of its input."""
    result = await run_command(
        ["/bin/sh", "-c", "echo gone; exit 3"], env={}, timeout_s=10, stdin="quit\n" * 50000
    )

    assert result == CommandResult(3, "gone\n", "")


async def test_a_program_that_cannot_start_is_a_hardware_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match=f"cannot run {tmp_path}/missing"):
        await run_command([str(tmp_path / "missing")], env={}, timeout_s=10)
