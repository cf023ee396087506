"""MPS control daemons in pods of their own: the `MpsDaemonRunner` of `--mps-daemons pod`.

The agent prepares the claim's directories as for a local daemon, creates the daemon's pod
(mps_pod_spec.py) and waits, bounded, until the daemon accepts connections on its control socket
in the claim's pipe directory: that socket is on the host, so the agent reaches the daemon there
whatever container it runs in, and talks to it with its own copy of the control program, as it
does to a local daemon. A daemon that does not answer in time fails the prepare, and its pod and
directories go. Unprepare sends `quit`, waits for the daemon to stop answering, deletes the pod,
then removes the directories.

Nothing here lives in the agent's memory: the pod is found by name (from the claim UID), the
daemon by its socket, so an agent that restarted, or the other agent of a rolling update, stops
the daemon another agent started, and a restart of the agent leaves every daemon running.
"""

import asyncio
import shutil
from pathlib import Path

import structlog

from dra_driver.claims.sharing.mps import (
    MpsControlDaemons,
    control_socket_answers,
    prepare_directories,
    wait_until,
)
from dra_driver.claims.sharing.mps_pod_spec import (
    MpsPodSettings,
    claim_uid_of,
    daemon_pod,
    daemon_pod_name,
    selector,
)
from dra_driver.claims.sharing.sharing import MpsDaemonSpec, MpsDirectories
from dra_driver.hardware.model import HardwareError
from dra_driver.kube.errors import ApiError
from dra_driver.kube.pod_api import PodApi

log = structlog.get_logger("dra_driver.claims")

_POLL_S = 0.05
# The pod's phase is looked at this often while waiting, to give up early on a pod that ended.
_POD_POLL_S = 1.0
_ENDED = ("Succeeded", "Failed")


class MpsDaemonPods:
    """`local`: the control program the agent talks to daemons with, and the directories' root."""

    def __init__(
        self, local: MpsControlDaemons, pods: PodApi, settings: MpsPodSettings, *, start_timeout_s: float
    ) -> None:
        self._local = local
        self._pods = pods
        self._settings = settings
        self._timeout = start_timeout_s

    @property
    def runtime_dir(self) -> Path:
        return self._local.runtime_dir

    async def start(self, spec: MpsDaemonSpec) -> None:
        """Creates the claim's daemon pod and applies its defaults; a daemon that answers is kept
        as it is. When anything fails, nothing of the claim's daemon is left."""
        directories = spec.directories
        if directories.runtime_dir != self.runtime_dir:
            raise ValueError(f"MPS spec for {directories.root} is not under {self.runtime_dir}")
        if await asyncio.to_thread(control_socket_answers, directories):
            return
        name = daemon_pod_name(directories.claim_uid)
        try:
            # The pod of a daemon that died (or of a prepare cut short) goes first: a pod's
            # name is taken until it is gone.
            await self._delete_pod(name, wait=True)
            await asyncio.to_thread(prepare_directories, directories)
            await self._pods.create(daemon_pod(spec, self._settings))
            await self._wait_for_daemon(directories, name)
            for command in spec.control_commands():
                await self._local.send(directories, command)
        except (ApiError, HardwareError) as error:
            try:
                await self._remove(directories)
            except (ApiError, HardwareError, OSError) as cleanup_error:
                raise HardwareError(f"{error}; cleaning up after it failed too: {cleanup_error}") from error
            if isinstance(error, ApiError):
                raise HardwareError(str(error)) from error
            raise

    async def stop(self, claim_uid: str) -> None:
        try:
            await self._remove(MpsDirectories(self.runtime_dir, claim_uid))
        except ApiError as error:
            raise HardwareError(f"the MPS daemon pod of claim {claim_uid} stays: {error}") from error

    async def is_running(self, claim_uid: str) -> bool:
        return await asyncio.to_thread(control_socket_answers, MpsDirectories(self.runtime_dir, claim_uid))

    async def leftover_claim_uids(self) -> set[str]:
        """Claims with directories here, or with a daemon pod on this node (a pod outlives the
        node's /run after a reboot, and a crash may leave one whose directories are gone)."""
        local = await self._local.leftover_claim_uids()
        try:
            pods = await self._pods.list_on_node(selector())
        except ApiError as error:
            # Start-up does not wait for the API server: the pods are looked for at the next start.
            log.warning("MPS daemon pods not listed; only their directories are swept", error=str(error))
            return local
        return local | {uid for pod in pods if (uid := claim_uid_of(pod)) is not None}

    async def _remove(self, directories: MpsDirectories) -> None:
        """Graceful `quit` while the daemon answers, then the pod, then the directories."""
        if await asyncio.to_thread(control_socket_answers, directories):
            await self._local.send(directories, "quit")
            if not await wait_until(lambda: not control_socket_answers(directories), self._timeout, _POLL_S):
                raise HardwareError(
                    f"the MPS control daemon for claim {directories.claim_uid} still answers "
                    f"{self._timeout:g} s after 'quit'; its pod and {directories.root} stay until it stops"
                )
        await self._delete_pod(daemon_pod_name(directories.claim_uid), wait=False)
        if await asyncio.to_thread(directories.root.exists):
            await asyncio.to_thread(shutil.rmtree, directories.root)

    async def _delete_pod(self, name: str, *, wait: bool) -> None:
        pod = await self._pods.get(name)
        if pod is None:
            return
        await self._pods.delete(name, pod["metadata"].get("uid", ""))
        if not wait:
            return
        deadline = asyncio.get_running_loop().time() + self._timeout
        while await self._pods.get(name) is not None:
            if asyncio.get_running_loop().time() > deadline:
                raise HardwareError(
                    f"the old MPS daemon pod {self._pods.namespace}/{name} is still there "
                    f"{self._timeout:g} s after it was deleted"
                )
            await asyncio.sleep(_POD_POLL_S)

    async def _wait_for_daemon(self, directories: MpsDirectories, name: str) -> None:
        """Until the daemon answers on its control socket; a pod that ended or vanished, or no
        answer within the timeout, is an error naming the claim, the pod and the socket."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        next_look = loop.time() + _POD_POLL_S
        phase = "not looked at yet"
        while not await asyncio.to_thread(control_socket_answers, directories):
            now = loop.time()
            if now >= next_look or now > deadline:
                pod = await self._pods.get(name)
                phase = "gone" if pod is None else str((pod.get("status") or {}).get("phase", "Pending"))
                next_look = now + _POD_POLL_S
                if pod is None or phase in _ENDED or now > deadline:
                    raise HardwareError(
                        f"the MPS control daemon of claim {directories.claim_uid} did not answer on "
                        f"{directories.pipe}/control within {self._timeout:g} s "
                        f"(pod {self._pods.namespace}/{name}: {phase})"
                    )
            await asyncio.sleep(_POLL_S)
