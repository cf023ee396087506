"""GPU usage from NVML: memory, utilisation and running compute processes of every GPU and MIG device.

The reader takes its own NVML reference (nvmlInit counts them) and is called from the usage
sampler's thread, never from the backend's NVML thread: NVML is thread-safe, and a call that
hangs in the driver then stalls the next sample, not the next prepare.
"""

import time
from pathlib import Path

import pynvml

from dra_driver.hardware.model import HardwareError, HardwareErrorReason
from dra_driver.hardware.nvml_calls import (
    NO_MIG_DEVICE_AT_INDEX,
    NOT_SUPPORTED,
    NvmlObject,
    nvml_call,
    nvml_call_or_none,
    nvml_text,
)
from dra_driver.hardware.nvml_library import load_nvml_library
from dra_driver.hardware.usage import DeviceUsage, ProcessUsage

# How NVML says "no per-process samples": none in its buffer since the timestamp (NOT_FOUND), none
# kept for this device (NOT_SUPPORTED: MIG devices, vGPU guests), or an older driver.
_NO_SAMPLES = frozenset(
    {pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


def _processes(handle: NvmlObject, where: str, samples: dict[int, float]) -> tuple[ProcessUsage, ...]:
    running = nvml_call(
        f"nvmlDeviceGetComputeRunningProcesses {where}", pynvml.nvmlDeviceGetComputeRunningProcesses, handle
    )
    return tuple(
        ProcessUsage(
            pid=int(process.pid),
            memory_bytes=None
            if process.usedGpuMemory in (None, _NOT_AVAILABLE)
            else int(process.usedGpuMemory),
            sm_percent=samples.get(int(process.pid)),
        )
        for process in running
    )


def _process_samples(handle: NvmlObject, where: str, since_us: int) -> dict[int, float]:
    """SM utilisation by pid over the window since `since_us`; a pid sampled twice keeps its latest."""
    samples = nvml_call_or_none(
        f"nvmlDeviceGetProcessUtilization {where}",
        _NO_SAMPLES,
        pynvml.nvmlDeviceGetProcessUtilization,
        handle,
        since_us,
    )
    latest: dict[int, tuple[int, float]] = {}
    for sample in samples or ():
        pid, stamp = int(sample.pid), int(sample.timeStamp)
        if pid not in latest or stamp >= latest[pid][0]:
            latest[pid] = (stamp, float(sample.smUtil))
    return {pid: util for pid, (_stamp, util) in latest.items()}


def _device_usage(
    handle: NvmlObject, gpu_uuid: str, mig: tuple[str, int] | None, where: str, since_us: int
) -> DeviceUsage:
    memory = nvml_call(f"nvmlDeviceGetMemoryInfo {where}", pynvml.nvmlDeviceGetMemoryInfo, handle)
    utilization = nvml_call_or_none(
        f"nvmlDeviceGetUtilizationRates {where}", NOT_SUPPORTED, pynvml.nvmlDeviceGetUtilizationRates, handle
    )
    samples = {} if mig else _process_samples(handle, where, since_us)
    return DeviceUsage(
        gpu_uuid=gpu_uuid,
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization_percent=None if utilization is None else float(utilization.gpu),
        processes=_processes(handle, where, samples),
        mig_uuid=None if mig is None else mig[0],
        mig_placement_start=None if mig is None else mig[1],
    )


def _placement_start(gpu: NvmlObject, device: NvmlObject, where: str) -> int:
    instance_id = nvml_call(f"nvmlDeviceGetGpuInstanceId {where}", pynvml.nvmlDeviceGetGpuInstanceId, device)
    instance = nvml_call(
        f"nvmlDeviceGetGpuInstanceById {where}", pynvml.nvmlDeviceGetGpuInstanceById, gpu, instance_id
    )
    info = nvml_call(f"nvmlGpuInstanceGetInfo {where}", pynvml.nvmlGpuInstanceGetInfo, instance)
    return int(info.placement.start)


def _mig_devices(handle: NvmlObject, where: str) -> list[tuple[NvmlObject, tuple[str, int]]]:
    count = nvml_call_or_none(
        f"nvmlDeviceGetMaxMigDeviceCount {where}",
        NOT_SUPPORTED,
        pynvml.nvmlDeviceGetMaxMigDeviceCount,
        handle,
    )
    devices = []
    for index in range(count or 0):
        device = nvml_call_or_none(
            f"nvmlDeviceGetMigDeviceHandleByIndex {where} MIG device {index}",
            NO_MIG_DEVICE_AT_INDEX,
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
            handle,
            index,
        )
        if device is not None:
            uuid = nvml_text(nvml_call(f"nvmlDeviceGetUUID {where}", pynvml.nvmlDeviceGetUUID, device))
            devices.append((device, (uuid, _placement_start(handle, device, f"{where} {uuid}"))))
    return devices


def read_all(since_us: int) -> tuple[DeviceUsage, ...]:
    """Every GPU, then its MIG devices. A GPU that cannot be read (lost) is left out: the health
    monitor reports it, and its series go away rather than freeze at their last value."""
    usage: list[DeviceUsage] = []
    for index in range(nvml_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)):
        where = f"(GPU {index})"
        try:
            handle = nvml_call(
                f"nvmlDeviceGetHandleByIndex {where}", pynvml.nvmlDeviceGetHandleByIndex, index
            )
            gpu_uuid = nvml_text(nvml_call(f"nvmlDeviceGetUUID {where}", pynvml.nvmlDeviceGetUUID, handle))
            gpu = _device_usage(handle, gpu_uuid, None, where, since_us)
            migs = [
                _device_usage(device, gpu_uuid, mig, f"{where} {mig[0]}", since_us)
                for device, mig in _mig_devices(handle, where)
            ]
        except HardwareError as error:
            if error.reason is HardwareErrorReason.GPU_LOST:
                continue
            raise
        usage.append(gpu)
        usage.extend(migs)
    return tuple(usage)


class NvmlUsageReader:
    """A UsageReader over NVML; per-process samples cover the time since the previous read."""

    def __init__(self, driver_root: Path = Path("/")) -> None:
        self._driver_root = driver_root
        self._initialized = False
        self._last_read_us = 0

    def read_usage(self) -> tuple[DeviceUsage, ...]:
        if not self._initialized:
            load_nvml_library(self._driver_root)
            nvml_call("nvmlInit", pynvml.nvmlInit)
            self._initialized = True
        now_us = int(time.time() * 1_000_000)
        usage = read_all(self._last_read_us)
        self._last_read_us = now_us
        return usage

    def close(self) -> None:
        if self._initialized:
            nvml_call("nvmlShutdown", pynvml.nvmlShutdown)
            self._initialized = False
