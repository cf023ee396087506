"""The MPS control daemon of a claim: started on prepare, stopped on unprepare, found after a restart.

A claim that shares its devices through MPS gets a control daemon of its own, started with the
claim's devices in CUDA_VISIBLE_DEVICES and the claim's directories (`MpsDirectories`) for its
pipes, logs and shared memory. Everything about a running daemon is on disk: the daemon writes
its PID into its pipe directory (MPS documentation: nvidia-cuda-mps-control.pid in
CUDA_MPS_PIPE_DIRECTORY), so an agent that restarted finds the daemon of any claim again from
the claim UID alone, and `claim_uids` lists the claims that have directories, for cleaning up
after claims no record owns. The daemon does not need the agent: it runs in a session of its
own and survives the agent process. Where the agent runs in a container, though, the container
runtime ends it together with the agent's container; that is why a cluster runs each daemon in a
pod of its own instead (`--mps-daemons pod`, mps_pods.py), which uses this class for the control
program and the claim's directories only.

The lifecycle is the same for the real daemon and the simulated one; they differ in the program
that plays nvidia-cuda-mps-control, which speaks one protocol: `<control> -d` starts a daemon
that serves the pipe directory in its environment, and `<control>` alone sends its stdin to that
daemon ("quit" stops it). Calls for one claim must not overlap (the engine's per-claim lock).
"""

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from dra_driver.claims.sharing.sharing import CONTAINER_SHM_DIRECTORY, MpsDaemonSpec, MpsDirectories
from dra_driver.hardware import simulated_mps_control
from dra_driver.hardware.driver_root import DriverDiscovery
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.time_slicing import driver_program, run_command
from dra_driver.kube.k8s_names import uid_problem

PID_FILE = "nvidia-cuda-mps-control.pid"
# The daemon listens on this socket in its pipe directory ("Starting control daemon using socket
# <pipe dir>/control" in its log); a socket path has at most 107 bytes on Linux.
CONTROL_SOCKET = "control"
_MAX_SOCKET_PATH = 107
_LONGEST_UID = "00000000-0000-0000-0000-000000000000"  # every claim UID has this length
# What `<control> -d` printed, kept for the error message when the daemon does not come up.
STARTUP_LOG = "startup.log"
DEFAULT_TIMEOUT_S = 20.0
_POLL_S = 0.02


class MpsDaemonRunner(Protocol):
    """Where a claim's daemon runs, as the claim engine sees it: a process of the agent
    (`MpsControlDaemons`) or a pod of its own (`mps_pods.MpsDaemonPods`). Every call is
    idempotent, and tolerates a daemon that never started or is already gone."""

    @property
    def runtime_dir(self) -> Path: ...

    async def start(self, spec: MpsDaemonSpec) -> None: ...

    async def stop(self, claim_uid: str) -> None: ...

    async def is_running(self, claim_uid: str) -> bool: ...

    async def leftover_claim_uids(self) -> set[str]:
        """The claims that have anything of a daemon here (directories, pods), for start-up to
        remove what no record owns."""
        ...


class MpsControlDaemons:
    """Per-claim MPS control daemons, under `runtime_dir`, run by the program `control`.

    `env` is the program's own environment (PATH, preloaded libraries); the daemon's variables
    are added per claim. With `private_shm` the daemon starts in a mount namespace of its own in
    which the claim's shm directory is /dev/shm, the directory every container of the claim gets
    there (needs CAP_SYS_ADMIN and util-linux's unshare).
    """

    def __init__(
        self,
        runtime_dir: Path,
        control: Sequence[str],
        env: Mapping[str, str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        private_shm: bool = False,
    ) -> None:
        runtime_dir = runtime_dir.absolute()
        longest = MpsDirectories(runtime_dir, _LONGEST_UID).pipe / CONTROL_SOCKET
        if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"MPS runtime directory {runtime_dir} is too long: the daemon's socket {longest} would be "
                f"longer than the {_MAX_SOCKET_PATH} bytes a unix socket path may have"
            )
        self._runtime_dir = runtime_dir
        self._control = tuple(control)
        self._env = dict(env)
        self._timeout = timeout_s
        self._private_shm = private_shm

    @property
    def runtime_dir(self) -> Path:
        return self._runtime_dir

    def foreground_command(self) -> tuple[tuple[str, ...], Mapping[str, str]]:
        """The program line and environment that run a daemon in the foreground (`-f`, as in
        NVIDIA's documentation), as a pod's only process; the claim's variables are added to it."""
        return (*self._control, "-f"), dict(self._env)

    async def start(self, spec: MpsDaemonSpec) -> None:
        """Starts the claim's daemon and applies its defaults; a daemon already running for the
        claim is kept as it is, one that died is replaced in the same directories (so the agent
        calls this again for its MPS claims when it starts). When anything fails, nothing of the
        claim's daemon is left."""
        directories = spec.directories
        if directories.runtime_dir != self.runtime_dir:
            raise ValueError(f"MPS spec for {directories.root} is not under {self.runtime_dir}")
        if await self._answers(directories):
            return
        await asyncio.to_thread(prepare_directories, directories)
        env = {**self._env, **spec.daemon_environment()}
        try:
            await self._launch(directories, env)
            for command in spec.control_commands():
                await self._send(directories, env, command)
        except Exception as error:
            try:
                await self._stop(directories)
            except Exception as cleanup_error:
                raise HardwareError(f"{error}; cleaning up after it failed too: {cleanup_error}") from error
            raise

    async def is_running(self, claim_uid: str) -> bool:
        return await self._answers(MpsDirectories(self.runtime_dir, claim_uid))

    async def _answers(self, directories: MpsDirectories) -> bool:
        """Whether the claim's daemon runs: here, its PID file names a live process of ours."""
        return await asyncio.to_thread(daemon_pid, directories) is not None

    async def leftover_claim_uids(self) -> set[str]:
        return await asyncio.to_thread(self.claim_uids)

    async def stop(self, claim_uid: str) -> None:
        """Stops the claim's daemon, if one runs, and removes its directories. A claim without a
        daemon or directories is fine: unprepare may come twice, or after a failed prepare."""
        await self._stop(MpsDirectories(self.runtime_dir, claim_uid))

    def claim_uids(self) -> set[str]:
        """The claims that have MPS directories here. Other entries are not ours and are ignored."""
        if not self.runtime_dir.is_dir():
            return set()
        return {
            entry.name
            for entry in self.runtime_dir.iterdir()
            if entry.is_dir() and not uid_problem(entry.name)
        }

    async def _launch(self, directories: MpsDirectories, env: Mapping[str, str]) -> None:
        argv = [*self._control, "-d"]
        if self._private_shm:
            argv = private_shm_argv(directories.shm, argv)
        startup_log = directories.log / STARTUP_LOG
        returncode = await asyncio.to_thread(_launch_daemon, argv, dict(env), startup_log, self._timeout)
        if returncode == 0 and await wait_until(
            lambda: daemon_pid(directories) is not None, self._timeout, _POLL_S
        ):
            return
        said = (await asyncio.to_thread(startup_log.read_text, errors="replace")).strip()
        outcome = f"exit status {returncode}" if returncode is not None else f"no exit in {self._timeout:g} s"
        raise HardwareError(
            f"the MPS control daemon for claim {directories.claim_uid} did not start "
            f"({' '.join(argv)}: {outcome}): {said[:2000] or '(no output)'}"
        )

    async def send(self, directories: MpsDirectories, command: str) -> None:
        """One command to the claim's running daemon; talking to a daemon needs only its pipe
        directory, so a restarted agent (or another process) can stop it."""
        env = {
            **self._env,
            "CUDA_MPS_PIPE_DIRECTORY": str(directories.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(directories.log),
        }
        await self._send(directories, env, command)

    async def _send(self, directories: MpsDirectories, env: Mapping[str, str], command: str) -> None:
        result = await run_command(self._control, env=env, stdin=command + "\n", timeout_s=self._timeout)
        if result.returncode != 0:
            raise HardwareError(
                f"the MPS control daemon for claim {directories.claim_uid} refused {command!r} "
                f"(exit status {result.returncode}): {result.output()}"
            )

    async def _stop(self, directories: MpsDirectories) -> None:
        if not await asyncio.to_thread(directories.root.exists):
            return
        pid = await asyncio.to_thread(daemon_pid, directories)
        if pid is not None:
            await self.send(directories, "quit")
            if not await wait_until(lambda: not _is_daemon(pid, directories.pipe), self._timeout, _POLL_S):
                raise HardwareError(
                    f"the MPS control daemon for claim {directories.claim_uid} still runs "
                    f"{self._timeout:g} s after 'quit'; {directories.root} stays until it exits"
                )
        await asyncio.to_thread(shutil.rmtree, directories.root)


async def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float) -> bool:
    """Whether `condition` came true within `timeout_s`, looked at every `poll_s`. It reads files
    or sockets (whether a daemon runs, answers, has quit), so it runs off the event loop."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await asyncio.to_thread(condition):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


def private_shm_argv(shm_directory: Path, argv: Sequence[str]) -> list[str]:
    """`argv` run in a new mount namespace where `shm_directory` is bind-mounted on /dev/shm.

    MPS clients and their server meet in shared memory files under /dev/shm, a fixed path, so
    the daemon (and the servers it starts, which inherit its namespace) must see the same
    directory there as the claim's containers. The host's mounts stay untouched.
    """
    script = f'mount --bind "$0" {CONTAINER_SHM_DIRECTORY} && exec "$@"'
    new_namespace = ["unshare", "--mount", "--propagation", "private", "--"]
    return [*new_namespace, "sh", "-c", script, str(shm_directory), *argv]


def control_socket_answers(directories: MpsDirectories) -> bool:
    """Whether a daemon listens on the claim's control socket: a connection is accepted only
    while a daemon serves it, whichever PID namespace that daemon runs in."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(1.0)
        try:
            client.connect(str(directories.pipe / CONTROL_SOCKET))
        except OSError:
            return False
    return True


def prepare_directories(directories: MpsDirectories) -> None:
    """The directories of a daemon about to start, emptied but not replaced: containers of the
    claim that already run have them bind-mounted, and must reach the new daemon through them.
    Leftovers of a daemon that died (its PID file, its socket, its shared memory) would make the
    new one refuse to start or be mistaken for it; its logs are kept."""
    for directory in (directories.pipe, directories.log, directories.shm):
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    for directory in (directories.pipe, directories.shm):
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def daemon_pid(directories: MpsDirectories) -> int | None:
    """The PID of the claim's running daemon, or None. The PID file alone is not trusted: the
    process must be alive and serve this pipe directory, so a PID reused by an unrelated
    process after the daemon died is never taken for it."""
    try:
        text = (directories.pipe / PID_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if _is_daemon(pid, directories.pipe) else None


def _is_daemon(pid: int, pipe_directory: Path) -> bool:
    return _alive(pid) and _serves(pid, pipe_directory)


def _alive(pid: int) -> bool:
    # A daemon whose parent exited is re-parented to the nearest subreaper, often the agent
    # itself (PID 1 of its container): reap it here, or its zombie would look alive forever.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    # "<pid> (<command, which may contain spaces and parentheses>) <state> ..."
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _serves(pid: int, pipe_directory: Path) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return b"CUDA_MPS_PIPE_DIRECTORY=" + os.fsencode(pipe_directory) in environ.split(b"\0")


class NvidiaMps(MpsControlDaemons):
    """Real daemons: the driver root's nvidia-cuda-mps-control, with the driver's CUDA and NVML
    libraries preloaded (its MPS server loads CUDA), in a private /dev/shm unless told otherwise."""

    def __init__(
        self,
        driver: DriverDiscovery,
        runtime_dir: Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        private_shm: bool = True,
    ) -> None:
        program = driver_program(driver, "nvidia-cuda-mps-control", preload=("cuda", "nvidia-ml"))
        super().__init__(
            runtime_dir, [str(program.path)], program.env, timeout_s=timeout_s, private_shm=private_shm
        )


# The simulated nvidia-cuda-mps-control writes what its daemon was told into this file of its pipe
# directory.
SIMULATED_SETTINGS_FILE = simulated_mps_control.SETTINGS_FILE
# Where the Python running the agent found this package: the daemons run the same copy of the
# program, also where that is not the interpreter's own (a source tree on PYTHONPATH).
_PACKAGE_ROOT = Path(simulated_mps_control.__file__).parents[2]


class SimulatedMps(MpsControlDaemons):
    """Daemons for the simulated backend: real, long-running processes that follow the claim,
    playing nvidia-cuda-mps-control's protocol (`hardware/simulated_mps_control.py`) with the
    Python that runs the agent."""

    def __init__(self, runtime_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(
            runtime_dir,
            [sys.executable, "-m", simulated_mps_control.MODULE],
            {"PYTHONPATH": str(_PACKAGE_ROOT)},
            timeout_s=timeout_s,
        )


def _launch_daemon(argv: list[str], env: dict[str, str], startup_log: Path, timeout_s: float) -> int | None:
    """Runs the control program's `-d` launcher to its exit (None: killed after `timeout_s`),
    from a worker thread rather than the event loop (commands/event_loop.py). Its output goes
    to `startup_log`, not through pipes: the daemon it forks may keep them open, and a reader
    would wait for it."""
    with startup_log.open("wb") as output:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env, start_new_session=True
        )
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None
