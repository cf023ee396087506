"""GPU usage of a simulated node: idle GPUs, plus whatever a test or demo writes into a usage file.

The file (JSON) names devices by GPU or MIG UUID:
    {"<uuid>": {"utilization": 40, "processes": [{"pid": 4242, "memoryBytes": 1073741824, "smPercent": 30}]}}
Memory used is the sum of the processes' memory, as on a real GPU with nothing but compute work.
A file that cannot be read or parsed is reported as an error of the sample, never half-applied.
"""

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from dra_driver.base.strict_decode import DecodeError
from dra_driver.base.typed_decode import typed_values
from dra_driver.hardware.model import Gpu, HardwareError
from dra_driver.hardware.usage import DeviceUsage, ProcessUsage

_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _ProcessFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    pid: Annotated[int, msgspec.Meta(ge=0)]
    memory_bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    sm_percent: _NonNegative | None = None


class _DeviceFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    utilization: _NonNegative = 0
    processes: tuple[_ProcessFile, ...] = ()


_IDLE = _DeviceFile()


def usage_from_json(gpus: tuple[Gpu, ...], data: object) -> tuple[DeviceUsage, ...]:
    """Every GPU and MIG instance of `gpus`, with what `data` says runs on it (pure)."""
    if not isinstance(data, Mapping):
        raise HardwareError("simulated usage: expected an object keyed by GPU or MIG UUID")
    known = {gpu.uuid for gpu in gpus} | {mig.uuid for gpu in gpus for mig in gpu.mig_instances}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"simulated usage: no GPU or MIG device {unknown[0]} on this node")
    try:
        # An entry left empty (null, {}) is a device with nothing on it.
        entries = typed_values({uuid: entry or {} for uuid, entry in data.items()}, _DeviceFile)
    except DecodeError as error:
        raise HardwareError(f"simulated usage {error}") from error

    def device(gpu: Gpu, uuid: str, total: int, mig: int | None) -> DeviceUsage:
        entry = entries.get(uuid, _IDLE)
        processes = tuple(
            ProcessUsage(pid=process.pid, memory_bytes=process.memory_bytes, sm_percent=process.sm_percent)
            for process in entry.processes
        )
        return DeviceUsage(
            gpu_uuid=gpu.uuid,
            memory_used_bytes=sum(p.memory_bytes or 0 for p in processes),
            memory_total_bytes=total,
            utilization_percent=None if mig is not None else float(entry.utilization),
            processes=processes,
            mig_uuid=None if mig is None else uuid,
            mig_placement_start=mig,
        )

    usage = []
    for gpu in gpus:
        usage.append(device(gpu, gpu.uuid, gpu.memory_bytes, None))
        for instance in gpu.mig_instances:
            profile = gpu.mig_profile(instance.profile_id)
            total = profile.memory_bytes if profile else 0
            usage.append(device(gpu, instance.uuid, total, instance.placement.start))
    return tuple(usage)


class SimulatedUsageReader:
    """A UsageReader over the simulated node's GPUs (asked anew each time: MIG instances come and go)."""

    def __init__(self, gpus: Callable[[], tuple[Gpu, ...]], usage_file: Path | None) -> None:
        self._gpus = gpus
        self._usage_file = usage_file

    def read_usage(self) -> tuple[DeviceUsage, ...]:
        data: object = {}
        if self._usage_file is not None:
            try:
                data = json.loads(self._usage_file.read_text(encoding="utf-8"))
            except FileNotFoundError:
                data = {}
            except (OSError, ValueError) as error:
                raise HardwareError(f"simulated usage {self._usage_file}: {error}") from error
        return usage_from_json(self._gpus(), data)

    def close(self) -> None:
        return None
