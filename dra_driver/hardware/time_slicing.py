"""A GPU's compute time slice: how long one process runs before the GPU switches to the next.

The claim engine changes it for a whole GPU whose claim asks for TimeSlicing with a fixed
interval, and sets it back on unprepare. `TimeSlicer` is all the engine sees; the simulated
backend records the setting in memory, real GPUs go through `nvidia-smi compute-policy`, because
NVML has no call for this setting. Programs of the driver run from the driver root with the
environment `driver_program` gives them, through `run_command` (which the MPS control daemon's
commands use too).
"""

import asyncio
import os
import re
import signal
import subprocess
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

import msgspec

from dra_driver.hardware.driver_root import DriverDiscovery
from dra_driver.hardware.model import HardwareError, HardwareErrorReason, TimeSliceInterval, TimeSliceSetting

# The argument of `nvidia-smi compute-policy --set-timeslice`. Source: the tool's own help
# (R455 and later), "Set timeslice config for a GPU: 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG", as
# quoted in NVIDIA's technical blog "Improving GPU Utilization in Kubernetes"; NVIDIA's DRA
# driver maps its Default/Short/Medium/Long intervals to the same numbers.
TIME_SLICE_LEVELS: Mapping[TimeSliceInterval, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DEFAULT_TIMEOUT_S = 20.0
# What the minimal environment of a driver program searches before the driver's own directory.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHOWN_OUTPUT = 2000
_GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# `compute-policy --list` prints one "Timeslice: <level>" per GPU (e.g. "GPU  0: Timeslice: Default").
# The layout comes from a transcript, not from NVIDIA's documentation, and nvidia-smi promises no
# stable output, so the parse is lenient: the level's name in any case, or its number.
_LISTED_TIME_SLICE = re.compile(r"timeslice\s*:\s*(default|short|medium|long|[0-3])\b", re.IGNORECASE)
_LEVEL_NAMES: Mapping[str, TimeSliceInterval] = {
    **{interval.lower(): interval for interval in TIME_SLICE_LEVELS},
    **{str(level): interval for interval, level in TIME_SLICE_LEVELS.items()},
}


class TimeSlicer(Protocol):
    async def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        """Sets the time slice of a whole GPU; raises HardwareError, naming the GPU, on failure."""
        ...

    async def current(self, gpu_uuid: str) -> TimeSliceInterval:
        """The time slice the GPU has now."""
        ...


class SimulatedTimeSlicer:
    """The time slices of a simulated node's GPUs, kept in memory; every GPU starts at Default.

    Like the simulated backend, nothing here awaits, so concurrent calls cannot interleave.
    """

    def __init__(self, gpu_uuids: Iterable[str]) -> None:
        self._intervals: dict[str, TimeSliceInterval] = dict.fromkeys(gpu_uuids, "Default")
        self._history: list[TimeSliceSetting] = []
        self._faults: deque[HardwareErrorReason] = deque()

    async def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        if self._faults:
            reason = self._faults.popleft()
            raise HardwareError(
                f"simulated time-slice failure on {gpu_uuid} injected by fail_next ({reason.value})", reason
            )
        self._known(gpu_uuid)
        self._intervals[gpu_uuid] = interval
        self._history.append(TimeSliceSetting(gpu_uuid, interval))

    async def current(self, gpu_uuid: str) -> TimeSliceInterval:
        return self._known(gpu_uuid)

    @property
    def history(self) -> tuple[TimeSliceSetting, ...]:
        """Every successful change, oldest first, so tests can see what was set and undone."""
        return tuple(self._history)

    def fail_next(self, reason: HardwareErrorReason) -> None:
        """The next set_time_slice raises HardwareError(reason) before changing anything; calls add up."""
        self._faults.append(reason)

    def _known(self, gpu_uuid: str) -> TimeSliceInterval:
        if gpu_uuid not in self._intervals:
            raise HardwareError(
                f"no GPU with UUID {gpu_uuid} on this simulated node ({len(self._intervals)} GPUs); "
                "a time slice is set on a whole GPU, never on a MIG device",
                HardwareErrorReason.NOT_FOUND,
            )
        return self._intervals[gpu_uuid]


# --- Running the driver's programs ----------------------------------------------------------------


class CommandResult(msgspec.Struct, frozen=True):
    returncode: int
    stdout: str
    stderr: str

    def output(self) -> str:
        """What the program said, for an error message: stderr, else stdout, cut short."""
        said = (self.stderr.strip() or self.stdout.strip())[:_SHOWN_OUTPUT]
        return said or "(no output)"


class CommandRunner(Protocol):
    async def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float, stdin: str = ""
    ) -> CommandResult: ...


async def run_command(
    argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float, stdin: str = ""
) -> CommandResult:
    """Runs `argv` to completion with exactly `env`, feeding it `stdin`.

    The program gets a session of its own, so a timeout kills it together with anything it
    started (a hung shell script's children too), and a signal meant for the agent's terminal
    never reaches it. Raises HardwareError when it cannot start or outlives `timeout_s` seconds.
    Started from a worker thread, not by the event loop: see commands/event_loop.py.
    """
    return await asyncio.to_thread(_run_to_completion, list(argv), dict(env), timeout_s, stdin.encode())


def _run_to_completion(argv: list[str], env: dict[str, str], timeout_s: float, stdin: bytes) -> CommandResult:
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as error:
        raise HardwareError(f"cannot run {argv[0]}: {error}") from error
    with process:
        try:
            stdout, stderr = process.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise HardwareError(
                f"{' '.join(argv)} did not finish within {timeout_s:g} s and was killed"
            ) from None
    return CommandResult(process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"))


class DriverProgram(msgspec.Struct, frozen=True):
    """A program of the NVIDIA driver as the agent runs it: its path on this machine, and the
    environment that makes it load the driver's own libraries rather than whatever the agent's
    image has. Preloading just those libraries, as NVIDIA's DRA driver does for nvidia-smi, is
    safer than pointing LD_LIBRARY_PATH at the driver root: that directory also holds the driver
    root's C library, which must not be mixed with the agent's dynamic loader."""

    path: Path
    env: Mapping[str, str]


def driver_program(discovery: DriverDiscovery, name: str, preload: Sequence[str]) -> DriverProgram:
    """The program `name` found by `discovery`, with the driver's libraries named in `preload`
    ("nvidia-ml", "cuda") preloaded where discovery found them.

    PATH ends with the program's own directory, so programs it starts by name (the MPS control
    daemon starts nvidia-cuda-mps-server) are found in the same driver, while the system tools
    the agent runs with this environment (sh, mount) still come from the agent's own image.
    Raises HardwareError (LIBRARY_NOT_FOUND) when the driver root does not have the program.
    """
    program = next((file for file in discovery.binaries if PurePosixPath(file.path).name == name), None)
    if program is None:
        raise HardwareError(
            f"{name} was not found in the driver root {discovery.root} "
            f"(looked in {', '.join(discovery.binary_dirs)})",
            HardwareErrorReason.LIBRARY_NOT_FOUND,
        )
    wanted = {f"lib{library}.so.{discovery.version}" for library in preload}
    libraries = [
        str(discovery.root.joinpath(file.resolved[1:]))
        for file in discovery.libraries
        if PurePosixPath(file.path).name in wanted
    ]
    path = discovery.root.joinpath(program.resolved[1:])
    env = {"PATH": f"{SYSTEM_PATH}:{path.parent}"}
    if libraries:
        env["LD_PRELOAD"] = ":".join(libraries)
    return DriverProgram(path=path, env=env)


# --- nvidia-smi ---------------------------------------------------------------------------------------


def _set_time_slice_argv(nvidia_smi: Path, gpu_uuid: str, interval: TimeSliceInterval) -> list[str]:
    return [
        str(nvidia_smi),
        "compute-policy",
        "-i",
        gpu_uuid,
        f"--set-timeslice={TIME_SLICE_LEVELS[interval]}",
    ]


def listed_time_slice(output: str) -> TimeSliceInterval | None:
    """The level in `nvidia-smi compute-policy -i <uuid> --list` output; None unless there is exactly one."""
    levels = _LISTED_TIME_SLICE.findall(output)
    return _LEVEL_NAMES[levels[0].lower()] if len(levels) == 1 else None


class NvidiaSmiTimeSlicer:
    """Sets time slices with the driver root's nvidia-smi. Needs root on the host, like nvidia-smi."""

    def __init__(
        self,
        driver: DriverDiscovery,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        run: CommandRunner = run_command,
    ) -> None:
        self._smi = driver_program(driver, "nvidia-smi", preload=("nvidia-ml",))
        self._timeout = timeout_s
        self._run = run

    async def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        argv = _set_time_slice_argv(self._smi.path, _checked_gpu_uuid(gpu_uuid), interval)
        result = await self._run(argv, env=self._smi.env, timeout_s=self._timeout)
        if result.returncode != 0:
            raise HardwareError(
                f"setting the time slice of GPU {gpu_uuid} to {interval} "
                f"(nvidia-smi compute-policy --set-timeslice={TIME_SLICE_LEVELS[interval]}) failed "
                f"with exit status {result.returncode}: {result.output()}"
            )

    async def current(self, gpu_uuid: str) -> TimeSliceInterval:
        argv = [str(self._smi.path), "compute-policy", "-i", _checked_gpu_uuid(gpu_uuid), "--list"]
        result = await self._run(argv, env=self._smi.env, timeout_s=self._timeout)
        if result.returncode != 0:
            raise HardwareError(
                f"listing the compute policy of GPU {gpu_uuid} (nvidia-smi compute-policy --list) failed "
                f"with exit status {result.returncode}: {result.output()}"
            )
        interval = listed_time_slice(result.stdout)
        if interval is None:
            raise HardwareError(
                f"nvidia-smi compute-policy --list for GPU {gpu_uuid} did not show one time slice: "
                f"{result.stdout.strip()[:_SHOWN_OUTPUT] or '(no output)'}"
            )
        return interval


def _checked_gpu_uuid(gpu_uuid: str) -> str:
    """Only a whole GPU has a time slice; the check also keeps anything that could pass for an
    option of nvidia-smi out of its command line."""
    if not _GPU_UUID.fullmatch(gpu_uuid):
        raise HardwareError(
            f"{gpu_uuid[:80]!r} is not the UUID of a whole GPU (GPU-<lowercase UUID>); "
            "a time slice is set on a whole GPU, never on a MIG device",
            HardwareErrorReason.INVALID_ARGUMENT,
        )
    return gpu_uuid
