"""XID events from NVML as health events the agent's event loop can iterate over.

NVML delivers XIDs through an event set that a caller waits on, and the wait blocks for up to its
timeout. So the NVML source waits on a thread of its own: on the NVML worker thread (nvml.py) every
discovery and MIG change would queue behind the wait. The thread hands each event to the loop with
`call_soon_threadsafe`, and waits with a short timeout so that stop() is honoured promptly. Nothing
here may take the agent down: errors are logged and the watch starts over after a pause.

A GPU that falls off the bus is lost for good (until a reboot), whichever way NVML says so: XID
79, or GPU_IS_LOST from a call on the GPU. Its events then stop, so the event set is rebuilt
without it, and waits on a set holding a lost GPU fail instead of delivering the others' XIDs.
"""

import asyncio
import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pynvml
import structlog

from dra_driver.hardware.events import GpuLost, HealthEvent
from dra_driver.hardware.health_events import QueuedEvents, health_event
from dra_driver.hardware.model import HardwareError, HardwareErrorReason
from dra_driver.hardware.nvml_calls import NvmlObject, nvml_call, nvml_text

log = structlog.get_logger("dra_driver.health.events")

# Past its wait timeout, how long stop() gives the NVML thread to finish the call it is in.
_STOP_GRACE_SECONDS = 2.0


def _address(handle: NvmlObject) -> int:
    """The device a handle points at: NVML hands out a new pointer object for the same device."""
    address: int = ctypes.cast(handle, ctypes.c_void_p).value or 0
    return address


class NvmlEvents(QueuedEvents):
    def __init__(
        self,
        wait_ms: int = 1000,
        retry_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
        known_gpus: Mapping[int, str] | None = None,
    ) -> None:
        """`wait_ms`: how long one NVML wait blocks, which bounds how long stop() takes.
        `retry_seconds`: the pause before watching again after an error. `clock`: the time an event
        is stamped with on arrival (NVML's events carry none). `known_gpus`: the UUIDs of the GPUs
        discovery found, by index, so that one lost before the watch starts is still reported."""
        super().__init__()
        self._known_gpus = dict(known_gpus or {})
        self._wait_ms = wait_ms
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._stopping = threading.Event()
        # Set by start(), before the thread that uses it exists.
        self._loop: asyncio.AbstractEventLoop
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, self._wait_ms / 1000 + _STOP_GRACE_SECONDS)
            if not thread.is_alive():
                return
            log.warning("the NVML event thread is stuck in an NVML call; leaving it behind")
        self._queue.put_nowait(None)

    def _deliver(self, event: HealthEvent | None) -> None:
        # A closed loop means the agent is gone and nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._watch()
                    return
                except Exception:
                    log.exception(
                        "watching NVML for XID events failed; trying again",
                        retry_in_seconds=self._retry_seconds,
                    )
                    self._stopping.wait(self._retry_seconds)
        finally:
            self._deliver(None)

    def _watch(self) -> None:
        """Returns when stopped, or when there is nothing to watch; raises on errors."""
        nvml_call("nvmlInit", pynvml.nvmlInit)
        try:
            lost: set[str] = set()
            gpus = self._gpus(lost)
            while not self._stopping.is_set():
                event_set = nvml_call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
                try:
                    watched = self._register(event_set, gpus, lost)
                    if not watched:
                        log.warning("no GPU reports XID events; their faults will not taint devices")
                        return
                    self._wait(event_set, watched, gpus, lost)
                finally:
                    _quietly("nvmlEventSetFree", pynvml.nvmlEventSetFree, event_set)
        finally:
            _quietly("nvmlShutdown", pynvml.nvmlShutdown)

    def _gpus(self, lost: set[str]) -> dict[str, NvmlObject]:
        """Every GPU NVML can still reach, by UUID. One it cannot is skipped, so that the others are
        still watched, and reported lost under the UUID discovery knew it by (NVML gives none
        without a handle)."""
        gpus = {}
        for index in range(nvml_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)):
            try:
                handle = nvml_call(
                    f"nvmlDeviceGetHandleByIndex({index})", pynvml.nvmlDeviceGetHandleByIndex, index
                )
                uuid = nvml_call(f"nvmlDeviceGetUUID for GPU {index}", pynvml.nvmlDeviceGetUUID, handle)
            except HardwareError as error:
                if error.reason is not HardwareErrorReason.GPU_LOST:
                    raise
                log.warning("GPU is lost; its XIDs cannot be watched", gpu_index=index, error=str(error))
                if index in self._known_gpus and self._known_gpus[index] not in lost:
                    self._lose(self._known_gpus[index], lost)
                continue
            gpus[nvml_text(uuid)] = handle
        return gpus

    def _lose(self, gpu_uuid: str, lost: set[str]) -> None:
        lost.add(gpu_uuid)
        self._deliver(GpuLost(gpu_uuid, self._clock()))

    def _register(self, event_set: NvmlObject, gpus: dict[str, NvmlObject], lost: set[str]) -> dict[int, str]:
        """Registers every GPU that is not lost for XIDs; the UUIDs of those registered, by address."""
        watched = {}
        for gpu_uuid, handle in gpus.items():
            if gpu_uuid in lost:
                continue
            where = f"for GPU {gpu_uuid}"
            try:
                supported = nvml_call(
                    f"nvmlDeviceGetSupportedEventTypes {where}",
                    pynvml.nvmlDeviceGetSupportedEventTypes,
                    handle,
                )
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    log.warning(
                        "GPU does not report XID events; its faults will not taint its devices", gpu=gpu_uuid
                    )
                    continue
                nvml_call(
                    f"nvmlDeviceRegisterEvents {where}",
                    pynvml.nvmlDeviceRegisterEvents,
                    handle,
                    pynvml.nvmlEventTypeXidCriticalError,
                    event_set,
                )
            except HardwareError as error:
                if error.reason is HardwareErrorReason.GPU_LOST:
                    self._lose(gpu_uuid, lost)
                    continue
                if error.reason is not HardwareErrorReason.NOT_SUPPORTED:
                    raise
                log.warning(
                    "GPU refuses XID events; its faults will not taint its devices",
                    gpu=gpu_uuid,
                    error=str(error),
                )
                continue
            watched[_address(handle)] = gpu_uuid
        return watched

    def _wait(
        self, event_set: NvmlObject, watched: dict[int, str], gpus: dict[str, NvmlObject], lost: set[str]
    ) -> None:
        """Delivers events until stopped, or until a GPU is lost and the set must be rebuilt."""
        while not self._stopping.is_set():
            try:
                data: Any = pynvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
            except pynvml.NVMLError as error:
                code = getattr(error, "value", None)
                if code == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                if code != pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                if self._find_lost(watched, gpus, lost):
                    return
                log.warning(
                    "NVML says a GPU is lost, yet every GPU answers; waiting before the next try",
                    retry_in_seconds=self._retry_seconds,
                )
                self._stopping.wait(self._retry_seconds)
                continue
            event = health_event(watched[_address(data.device)], int(data.eventData), self._clock())
            self._deliver(event)
            if isinstance(event, GpuLost):
                lost.add(event.gpu_uuid)
                return

    def _find_lost(self, watched: dict[int, str], gpus: dict[str, NvmlObject], lost: set[str]) -> bool:
        """A wait does not say which GPU is lost: asks each watched GPU for something NVML reads from
        the GPU itself. Whether any was found lost."""
        found = False
        for gpu_uuid in watched.values():
            try:
                pynvml.nvmlDeviceGetMemoryInfo(gpus[gpu_uuid])
            except pynvml.NVMLError as error:
                if getattr(error, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
                    self._lose(gpu_uuid, lost)
                    found = True
        return found


def _quietly(what: str, function: Callable[..., object], *args: NvmlObject) -> None:
    """Cleanup that must not hide the error that led to it."""
    try:
        function(*args)
    except pynvml.NVMLError as error:
        log.warning("NVML cleanup call failed", call=what, error=str(error))
