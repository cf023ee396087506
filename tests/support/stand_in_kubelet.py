"""A stand-in kubelet for tests: it runs the pods bound to its node as local processes.

It follows the pods of one namespace whose `spec.nodeName` is its node through the API server
(the stand-in, through the official client), polling a list: a pod it has not seen yet gets its
only container's command run with the container's environment, in a session of its own, and
its status set Running; a process that exits sets the pod Succeeded or Failed; a pod that is
deleted gets its process ended with SIGTERM (then SIGKILL), as kubelet does with a container.
Volumes are not mounted: the MPS daemon pods this serves mount host paths at the same paths, so
their programs find what they need where the host has it (the one exception, /dev/shm, is
unused by the simulated daemon). Processes outlive anything else in the test, agents included,
until the kubelet stops them or their pod goes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

_POLL_S = 0.05
_GRACE_S = 5.0


@dataclass
class _Running:
    uid: str
    process: subprocess.Popen[bytes]
    phase: str = "Running"


@dataclass
class StandInKubelet:
    kubeconfig: Path
    node_name: str
    namespace: str
    log_dir: Path
    _running: dict[str, _Running] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _api_client: Any = None
    errors: list[str] = field(default_factory=list)

    def start(self) -> StandInKubelet:
        self._api_client = config.new_client_from_config(str(self.kubeconfig))
        self._thread = threading.Thread(target=self._loop, name="stand-in-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the loop and every process it started."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for running in self._running.values():
            _terminate(running.process)
        if self._api_client is not None:
            self._api_client.close()

    def pid_of(self, pod_name: str) -> int | None:
        running = self._running.get(pod_name)
        return None if running is None or running.process.poll() is not None else running.process.pid

    def _loop(self) -> None:
        core = client.CoreV1Api(self._api_client)
        while not self._stop.is_set():
            try:
                self._sync(core)
            except Exception as error:  # kept for the test to see, never swallowed silently
                self.errors.append(repr(error))
            time.sleep(_POLL_S)

    def _sync(self, core: client.CoreV1Api) -> None:
        listed = core.list_namespaced_pod(self.namespace, field_selector=f"spec.nodeName={self.node_name}")
        pods = {pod.metadata.name: pod for pod in listed.items}
        for name, running in list(self._running.items()):
            pod = pods.get(name)
            if pod is None or pod.metadata.uid != running.uid:
                _terminate(running.process)
                del self._running[name]
        for name, pod in pods.items():
            if name not in self._running and (pod.status is None or pod.status.phase in (None, "Pending")):
                self._run(core, pod)
        for name, running in self._running.items():
            code = running.process.poll()
            if code is not None and running.phase == "Running":
                running.phase = "Succeeded" if code == 0 else "Failed"
                self._set_phase(core, pods[name], running.phase)

    def _run(self, core: client.CoreV1Api, pod: Any) -> None:
        container = pod.spec.containers[0]
        env = {variable.name: variable.value or "" for variable in container.env or ()}
        argv = [*(container.command or ()), *(container.args or ())]
        log = (self.log_dir / f"{pod.metadata.name}.log").open("ab")
        process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        self._running[pod.metadata.name] = _Running(pod.metadata.uid, process)
        self._set_phase(core, pod, "Running")

    def _set_phase(self, core: client.CoreV1Api, pod: Any, phase: str) -> None:
        pod.status = client.V1PodStatus(phase=phase)
        with contextlib.suppress(client.ApiException):  # deleted meanwhile, or changed: next round
            core.replace_namespaced_pod_status(pod.metadata.name, self.namespace, pod)


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
