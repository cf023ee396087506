"""The XID listeners: NVML's event set against a script, and the simulated backend's injected faults.

`ScriptedEventNvml` stands in for pynvml's event functions the way tests/unit/hardware/test_nvml_backend.py
stands in for the others: pynvml's own handle and structure types, pynvml.NVMLError for failures,
functions replaced by name (monkeypatch refuses a name pynvml lacks). Its waits block on a condition
for the timeout they are given, as NVML's do, so stopping promptly is tested for real.
"""

import asyncio
import contextlib
import ctypes
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import pynvml
import pytest
from structlog.testing import capture_logs

from dra_driver.hardware.events import GpuLost, HealthEvent, XidEvent
from dra_driver.hardware.health_events import HealthEventSource, SimulatedEvents, health_event
from dra_driver.hardware.nvml_events import NvmlEvents
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import resolve_node_spec

XID = pynvml.nvmlEventTypeXidCriticalError
NOW = 1_800_000_000.0
Source = TypeVar("Source", bound=HealthEventSource)
UUIDS = [f"GPU-00000000-0000-4000-8000-00000000000{index}" for index in range(3)]


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _handle(kind: Any, address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), kind)


def _address(handle: Any) -> int:
    address = ctypes.cast(handle, ctypes.c_void_p).value
    assert address is not None
    return address


@dataclass
class ScriptedGpu:
    uuid: str
    supported: int = pynvml.nvmlEventTypeAll
    # The NVML error nvmlDeviceRegisterEvents answers with, if any.
    register_error: int | None = None
    lost: bool = False
    # Lost so long that NVML hands out no handle for it.
    gone: bool = False


class ScriptedEventNvml:
    def __init__(self) -> None:
        self.gpus = [ScriptedGpu(uuid) for uuid in UUIDS]
        self.changed = threading.Condition()
        # event set id -> the GPU indices registered in it; a freed set is removed
        self.sets: dict[int, list[int]] = {}
        self.pending: dict[int, deque[tuple[int, int]]] = {}
        self.wait_failures: deque[int] = deque()
        self.failures: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []
        self.next_set = 1

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._recorded(name, getattr(self, name)))

    def _recorded(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with self.changed:
                self.calls.append((name, threading.current_thread().name))
                self.changed.notify_all()
                if name in self.failures:
                    _fail(self.failures[name])
            return method(*args)

        return call

    def called(self, name: str) -> int:
        return sum(1 for called, _thread in self.calls if called == name)

    # What the test does to the GPUs.
    def raise_xid(self, index: int, xid: int) -> None:
        with self.changed:
            for set_id, members in self.sets.items():
                if index in members:
                    self.pending[set_id].append((index, xid))
            self.changed.notify_all()

    def lose(self, index: int) -> None:
        with self.changed:
            self.gpus[index].lost = True
            self.changed.notify_all()

    def fail_next_wait(self, code: int) -> None:
        with self.changed:
            self.wait_failures.append(code)
            self.changed.notify_all()

    def watched(self) -> list[list[int]]:
        with self.changed:
            return [sorted(members) for members in self.sets.values()]

    def wait_until(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        with self.changed:
            assert self.changed.wait_for(done, timeout), "the listener never got there"

    def _gpu(self, handle: Any) -> ScriptedGpu:
        assert isinstance(handle, pynvml.c_nvmlDevice_t), f"expected a device handle, got {handle!r}"
        return self.gpus[_address(handle) - 0x5000]

    def _set(self, handle: Any) -> int:
        assert isinstance(handle, pynvml.c_nvmlEventSet_t), f"expected an event set, got {handle!r}"
        set_id = _address(handle) - 0x9000
        assert set_id in self.sets, "the event set was freed"
        return set_id

    # pynvml's functions.
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].gone:
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _handle(pynvml.c_nvmlDevice_t, 0x5000 + index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        if self._gpu(handle).lost:
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return pynvml.c_nvmlMemory_t()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.lost:
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu.supported

    def nvmlEventSetCreate(self) -> Any:
        with self.changed:
            set_id, self.next_set = self.next_set, self.next_set + 1
            self.sets[set_id], self.pending[set_id] = [], deque()
            return _handle(pynvml.c_nvmlEventSet_t, 0x9000 + set_id)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle)
        assert event_types == XID
        if gpu.lost:
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        if gpu.register_error is not None:
            _fail(gpu.register_error)
        with self.changed:
            self.sets[self._set(event_set)].append(self.gpus.index(gpu))
            self.changed.notify_all()

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        with self.changed:
            set_id = self._set(event_set)
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                if self.wait_failures:
                    _fail(self.wait_failures.popleft())
                if any(self.gpus[index].lost for index in self.sets[set_id]):
                    _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
                if self.pending[set_id]:
                    index, xid = self.pending[set_id].popleft()
                    data = pynvml.c_nvmlEventData_t()
                    data.device = self.nvmlDeviceGetHandleByIndex(index)
                    data.eventType = XID
                    data.eventData = xid
                    return data
                left = deadline - time.monotonic()
                if left <= 0:
                    _fail(pynvml.NVML_ERROR_TIMEOUT)
                self.changed.wait(left)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        with self.changed:
            del self.sets[self._set(event_set)]
            self.changed.notify_all()


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ScriptedEventNvml:
    scripted = ScriptedEventNvml()
    scripted.install(monkeypatch)
    return scripted


def listener() -> NvmlEvents:
    return NvmlEvents(wait_ms=50, retry_seconds=0.05, clock=lambda: NOW)


@contextlib.asynccontextmanager
async def started(source: Source) -> AsyncIterator[Source]:
    """The source, started, and stopped however the test ends, so no thread outlives it."""
    source.start()
    try:
        yield source
    finally:
        await source.stop()


async def next_event(source: HealthEventSource) -> HealthEvent:
    return await asyncio.wait_for(anext(source), 5)


async def rest(source: HealthEventSource) -> list[HealthEvent]:
    """What the source still delivers until its iteration ends."""
    return [event async for event in source]


async def test_xids_of_every_gpu_arrive_in_order_stamped_on_arrival(nvml: ScriptedEventNvml) -> None:
    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.watched() == [[0, 1, 2]])
            nvml.raise_xid(1, 48)
            nvml.raise_xid(0, 13)
            nvml.raise_xid(2, 94)
            got = [await next_event(events) for _ in range(3)]
            await events.stop()
            return got + await rest(events)

    assert await scenario() == [
        XidEvent(UUIDS[1], 48, NOW),
        XidEvent(UUIDS[0], 13, NOW),
        XidEvent(UUIDS[2], 94, NOW),
    ]


async def test_stop_ends_the_thread_promptly_and_releases_nvml(nvml: ScriptedEventNvml) -> None:
    async def scenario() -> float:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.called("nvmlEventSetWait_v2") > 2)
            began = time.monotonic()
            await events.stop()
            took = time.monotonic() - began
            assert await rest(events) == []
            return took

    assert await scenario() < 1.0
    assert nvml.sets == {}
    assert nvml.called("nvmlEventSetFree") == 1
    assert nvml.called("nvmlShutdown") == nvml.called("nvmlInit") == 1
    assert {thread for _name, thread in nvml.calls} == {"nvml-events"}


async def test_gpus_without_xid_events_are_skipped_saying_why(nvml: ScriptedEventNvml) -> None:
    nvml.gpus[0].supported = pynvml.nvmlEventTypeAll & ~XID
    nvml.gpus[2].register_error = pynvml.NVML_ERROR_NOT_SUPPORTED

    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.watched() == [[1]])
            nvml.raise_xid(1, 92)
            got = await next_event(events)
            return [got]

    with capture_logs() as logs:
        assert await scenario() == [XidEvent(UUIDS[1], 92, NOW)]
    skipped = [(entry["gpu"], entry["event"]) for entry in logs if "gpu" in entry]
    assert skipped == [
        (UUIDS[0], "GPU does not report XID events; its faults will not taint its devices"),
        (UUIDS[2], "GPU refuses XID events; its faults will not taint its devices"),
    ]
    assert "Not Supported" in next(entry["error"] for entry in logs if "error" in entry)


async def test_with_no_gpu_to_watch_the_iteration_ends(nvml: ScriptedEventNvml) -> None:
    for gpu in nvml.gpus:
        gpu.supported = 0

    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            return await asyncio.wait_for(rest(events), 5)

    with capture_logs() as logs:
        assert await scenario() == []
    assert logs[-1]["event"] == "no GPU reports XID events; their faults will not taint devices"
    assert nvml.sets == {}


async def test_xid_79_is_a_lost_gpu_and_the_others_are_still_watched(nvml: ScriptedEventNvml) -> None:
    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.watched() == [[0, 1, 2]])
            nvml.raise_xid(0, 79)
            lost = await next_event(events)
            nvml.wait_until(lambda: nvml.watched() == [[1, 2]])
            nvml.raise_xid(2, 48)
            got = [lost, await next_event(events)]
            return got

    assert await scenario() == [GpuLost(UUIDS[0], NOW), XidEvent(UUIDS[2], 48, NOW)]


async def test_a_gpu_lost_during_a_wait_is_found_and_left_out(nvml: ScriptedEventNvml) -> None:
    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.watched() == [[0, 1, 2]])
            nvml.lose(1)
            lost = await next_event(events)
            nvml.wait_until(lambda: nvml.watched() == [[0, 2]])
            nvml.raise_xid(0, 95)
            got = [lost, await next_event(events)]
            return got

    assert await scenario() == [GpuLost(UUIDS[1], NOW), XidEvent(UUIDS[0], 95, NOW)]


async def test_a_gpu_lost_before_registration_is_reported_lost(nvml: ScriptedEventNvml) -> None:
    nvml.gpus[2].lost = True

    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            lost = await next_event(events)
            nvml.wait_until(lambda: nvml.watched() == [[0, 1]])
            await events.stop()
            return [lost, *await rest(events)]

    assert await scenario() == [GpuLost(UUIDS[2], NOW)]


async def test_a_gpu_without_a_handle_is_skipped_and_the_others_watched(nvml: ScriptedEventNvml) -> None:
    nvml.gpus[1].gone = True

    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.watched() == [[0, 2]])
            nvml.raise_xid(2, 92)
            return [await next_event(events)]

    with capture_logs() as logs:
        assert await scenario() == [XidEvent(UUIDS[2], 92, NOW)]
    (skipped,) = [entry for entry in logs if "gpu_index" in entry]
    assert (skipped["event"], skipped["gpu_index"]) == ("GPU is lost; its XIDs cannot be watched", 1)


async def test_a_lost_gpu_nvml_cannot_point_at_is_retried_not_guessed(nvml: ScriptedEventNvml) -> None:
    nvml.fail_next_wait(pynvml.NVML_ERROR_GPU_IS_LOST)

    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.called("nvmlDeviceGetMemoryInfo") == 3)
            nvml.raise_xid(0, 74)
            got = await next_event(events)
            await events.stop()
            return [got, *await rest(events)]

    with capture_logs() as logs:
        assert await scenario() == [XidEvent(UUIDS[0], 74, NOW)]
    assert any(entry["event"].startswith("NVML says a GPU is lost, yet every GPU answers") for entry in logs)


@pytest.mark.parametrize("failing", ["nvmlInit", "nvmlEventSetCreate", "nvmlDeviceGetCount"])
async def test_an_nvml_failure_is_logged_and_the_watch_starts_over(
    nvml: ScriptedEventNvml, failing: str
) -> None:
    nvml.failures[failing] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND

    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.called(failing) >= 3)
            with nvml.changed:
                del nvml.failures[failing]
            nvml.wait_until(lambda: nvml.watched() == [[0, 1, 2]])
            nvml.raise_xid(1, 119)
            got = await next_event(events)
            return [got]

    with capture_logs() as logs:
        assert await scenario() == [XidEvent(UUIDS[1], 119, NOW)]
    failures = [entry for entry in logs if entry["event"].startswith("watching NVML for XID events failed")]
    assert len(failures) >= 2
    assert failures[0]["log_level"] == "error"
    # Every NVML initialization that succeeded was shut down again.
    succeeded = 1 if failing == "nvmlInit" else nvml.called("nvmlInit")
    assert nvml.called("nvmlShutdown") == succeeded


async def test_a_failed_wait_is_logged_and_watching_goes_on(nvml: ScriptedEventNvml) -> None:
    async def scenario() -> list[HealthEvent]:
        async with started(listener()) as events:
            nvml.wait_until(lambda: nvml.watched() == [[0, 1, 2]])
            nvml.fail_next_wait(pynvml.NVML_ERROR_UNKNOWN)
            nvml.wait_until(lambda: nvml.called("nvmlEventSetCreate") == 2 and nvml.watched() == [[0, 1, 2]])
            nvml.raise_xid(2, 140)
            got = await next_event(events)
            return [got]

    with capture_logs() as logs:
        assert await scenario() == [XidEvent(UUIDS[2], 140, NOW)]
    assert any(entry["event"].startswith("watching NVML for XID events failed") for entry in logs)
    # The failed round released what it held before the next one began.
    assert nvml.called("nvmlEventSetFree") == 2
    assert nvml.called("nvmlShutdown") == nvml.called("nvmlInit") == 2


async def test_stop_before_start_ends_the_iteration() -> None:
    async def scenario() -> list[HealthEvent]:
        events = listener()
        await events.stop()
        return await rest(events)

    assert await scenario() == []


@pytest.mark.parametrize(
    ("xid", "event"),
    [(79, GpuLost("GPU-x", NOW)), (48, XidEvent("GPU-x", 48, NOW)), (13, XidEvent("GPU-x", 13, NOW))],
)
def test_xid_79_and_only_79_means_lost(xid: int, event: HealthEvent) -> None:
    assert health_event("GPU-x", xid, NOW) == event


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    yield SimulatedBackend("node-a", resolve_node_spec("t4x4"))


async def test_simulated_faults_arrive_like_nvml_events(backend: SimulatedBackend) -> None:
    gpus = [gpu.uuid for gpu in await backend.discover()]

    async def scenario() -> list[HealthEvent]:
        async with started(SimulatedEvents(backend, interval_seconds=0.01, clock=lambda: NOW)) as events:
            backend.raise_xid(gpus[0], 48)
            backend.raise_xid(gpus[1], 13)
            got = [await next_event(events), await next_event(events)]
            backend.lose_gpu(gpus[2])
            got.append(await next_event(events))
            backend.raise_xid(gpus[3], 79)
            got.append(await next_event(events))
            await events.stop()
            return got + await rest(events)

    assert await scenario() == [
        XidEvent(gpus[0], 48, NOW),
        XidEvent(gpus[1], 13, NOW),
        GpuLost(gpus[2], NOW),
        GpuLost(gpus[3], NOW),
    ]


async def test_stopping_the_simulated_source_ends_its_iteration(backend: SimulatedBackend) -> None:
    async def scenario() -> list[HealthEvent]:
        async with started(SimulatedEvents(backend, interval_seconds=10.0)) as events:
            await asyncio.sleep(0)
            began = time.monotonic()
            await events.stop()
            assert time.monotonic() - began < 1.0
            return await rest(events)

    assert await scenario() == []
