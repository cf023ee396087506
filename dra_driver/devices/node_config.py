"""The node configuration file: how each GPU of the node is offered (whole, MIG, vGPU).

Decoded strictly and checked against the discovered hardware once, at start: a GPU that cannot
be offered the way the file asks stops the agent with an error naming the GPU and the setting,
instead of publishing devices that can never be prepared.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from dra_driver.devices.model import QUANTITY_FACTORS
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.yaml_files import YamlFileError, read_yaml_file

Mode = Literal["auto", "gpu", "mig-static", "mig-dynamic", "vgpu-capacity", "vgpu-partitions"]
ResolvedMode = Literal["gpu", "mig-static", "mig-dynamic", "vgpu-capacity", "vgpu-partitions"]
MODES: tuple[str, ...] = get_args(Mode)
MIB = 2**20


class NodeConfigError(ValueError):
    """The node configuration is malformed or does not fit this node's GPUs."""


@dataclass(frozen=True, slots=True)
class VgpuPartitionSize:
    memory_bytes: int
    # Percent of the GPU's SMs; None = the partition's share of memory.
    cores: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSettings:
    mode: Mode = "auto"
    # Capacity mode: the granularity of memory requests.
    memory_step: int = MIB
    partitions: tuple[VgpuPartitionSize, ...] = ()
    # Dynamic MIG: profile names to publish; empty = all.
    mig_profiles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuEntry:
    where: str
    index: int | None
    uuid: str | None
    settings: GpuSettings


@dataclass(frozen=True, slots=True)
class NodeConfig:
    default: GpuSettings = field(default_factory=GpuSettings)
    gpus: tuple[GpuEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What the device model does with one GPU, decided and checked."""

    gpu: Gpu
    mode: ResolvedMode
    settings: GpuSettings


_QUANTITY = re.compile(r"(0|[1-9][0-9]*)(Ki|Mi|Gi|Ti|k|M|G|T)?")


def _bytes(value: object, where: str) -> int:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise NodeConfigError(
            f"{where}: expected a whole number of bytes such as 10Gi, 512Mi or 1073741824, got {value!r}"
        )
    return int(match[1]) * QUANTITY_FACTORS[match[2] or ""]


def _mapping(raw: object, where: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise NodeConfigError(f"{where}: expected a mapping with fields {list(allowed)}, got {raw!r}")
    if unknown := sorted(str(key) for key in raw if key not in allowed):
        raise NodeConfigError(f"{where}: unknown field(s) {unknown}; allowed: {list(allowed)}")
    return raw


def _list(raw: object, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise NodeConfigError(f"{where}: expected a list, got {raw!r}")
    return raw


def _partition(raw: object, where: str) -> VgpuPartitionSize:
    fields = _mapping(raw, where, ("memory", "cores"))
    if "memory" not in fields:
        raise NodeConfigError(f"{where}.memory: required (the partition's memory, e.g. 10Gi)")
    memory = _bytes(fields["memory"], f"{where}.memory")
    if memory < MIB or memory % MIB:
        raise NodeConfigError(
            f"{where}.memory: must be a positive whole number of MiB, got {fields['memory']!r}"
        )
    cores = fields.get("cores")
    if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool) or not 1 <= cores <= 100):
        raise NodeConfigError(f"{where}.cores: expected an integer percentage from 1 to 100, got {cores!r}")
    return VgpuPartitionSize(memory, cores)


def _settings(raw: Mapping[str, Any], where: str) -> GpuSettings:
    mode = raw.get("mode", "auto")
    if mode not in MODES:
        raise NodeConfigError(f"{where}.mode: {mode!r} is not one of {', '.join(MODES)}")
    vgpu = _mapping(raw.get("vgpu", {}), f"{where}.vgpu", ("memoryStep", "partitions"))
    mig = _mapping(raw.get("mig", {}), f"{where}.mig", ("profiles",))
    if vgpu and not str(mode).startswith("vgpu-"):
        raise NodeConfigError(f"{where}.vgpu: only allowed with mode vgpu-capacity or vgpu-partitions")
    if mig and mode != "mig-dynamic":
        raise NodeConfigError(f"{where}.mig: only allowed with mode mig-dynamic")
    memory_step = _bytes(vgpu.get("memoryStep", "1Mi"), f"{where}.vgpu.memoryStep")
    if memory_step < MIB or memory_step % MIB:
        raise NodeConfigError(f"{where}.vgpu.memoryStep: must be a positive whole number of MiB")
    partitions = tuple(
        _partition(entry, f"{where}.vgpu.partitions[{number}]")
        for number, entry in enumerate(_list(vgpu.get("partitions", []), f"{where}.vgpu.partitions"))
    )
    if mode == "vgpu-partitions" and not partitions:
        raise NodeConfigError(
            f"{where}.vgpu.partitions: mode vgpu-partitions needs at least one partition size"
        )
    if "partitions" in vgpu and mode != "vgpu-partitions":
        raise NodeConfigError(f"{where}.vgpu.partitions: only allowed with mode vgpu-partitions")
    profiles = _list(mig.get("profiles", []), f"{where}.mig.profiles")
    if not all(isinstance(name, str) for name in profiles):
        raise NodeConfigError(
            f"{where}.mig.profiles: expected profile names such as 1g.10gb, got {profiles!r}"
        )
    return GpuSettings(
        mode=mode, memory_step=memory_step, partitions=partitions, mig_profiles=tuple(profiles)
    )


_SETTINGS_FIELDS = ("mode", "vgpu", "mig")


def _entry(raw: object, where: str) -> GpuEntry:
    fields = _mapping(raw, where, ("index", "uuid", *_SETTINGS_FIELDS))
    index, uuid = fields.get("index"), fields.get("uuid")
    if (index is None) == (uuid is None):
        raise NodeConfigError(f"{where}: set exactly one of 'index' or 'uuid' to say which GPU this is")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        raise NodeConfigError(f"{where}.index: expected a GPU index (an integer ≥ 0), got {index!r}")
    if uuid is not None and not isinstance(uuid, str):
        raise NodeConfigError(f"{where}.uuid: expected a GPU UUID string such as GPU-…, got {uuid!r}")
    return GpuEntry(where=where, index=index, uuid=uuid, settings=_settings(fields, where))


def parse_node_config(raw: object, origin: str) -> NodeConfig:
    if raw is None:
        return NodeConfig()
    try:
        fields = _mapping(raw, "node config", ("default", "gpus"))
        default = _settings(_mapping(fields.get("default", {}), "default", _SETTINGS_FIELDS), "default")
        entries = tuple(
            _entry(entry, f"gpus[{number}]")
            for number, entry in enumerate(_list(fields.get("gpus", []), "gpus"))
        )
    except NodeConfigError as error:
        raise NodeConfigError(f"{origin}: {error}") from error
    return NodeConfig(default=default, gpus=entries)


def load_node_config(path: Path | None) -> NodeConfig:
    if path is None:
        return NodeConfig()
    try:
        raw = read_yaml_file(path)
    except YamlFileError as error:
        raise NodeConfigError(f"node config {path}: {error}") from error
    return parse_node_config(raw, f"node config {path}")


def _describe(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.product_name}, {gpu.uuid})"


def _resolve_mode(gpu: Gpu, settings: GpuSettings, where: str) -> ResolvedMode:
    mode = settings.mode
    if mode == "auto":
        return "mig-static" if gpu.mig_mode is MigMode.ENABLED else "gpu"
    if mode.startswith("mig-"):
        if gpu.mig_mode is MigMode.UNSUPPORTED:
            raise NodeConfigError(f"{where}: mode {mode} on {_describe(gpu)}: this GPU does not support MIG")
        if gpu.mig_mode is MigMode.DISABLED:
            raise NodeConfigError(
                f"{where}: mode {mode} on {_describe(gpu)}: MIG mode is disabled on this GPU; "
                f"enable it first (nvidia-smi -i {gpu.index} -mig 1)"
            )
    elif gpu.mig_mode is MigMode.ENABLED:
        raise NodeConfigError(
            f"{where}: mode {mode} on {_describe(gpu)}: MIG mode is enabled, so the GPU cannot be used "
            "whole or shared; use mode mig-static or mig-dynamic, or disable MIG mode"
        )
    return mode


def _check_fits(gpu: Gpu, mode: ResolvedMode, settings: GpuSettings, where: str) -> None:
    if mode == "vgpu-partitions":
        sizes = set()
        for number, partition in enumerate(settings.partitions):
            setting = f"{where}.vgpu.partitions[{number}].memory"
            if partition.memory_bytes > gpu.memory_bytes:
                raise NodeConfigError(
                    f"{setting}: {partition.memory_bytes // MIB}Mi does not fit {_describe(gpu)}, "
                    f"which has {gpu.memory_bytes // MIB}Mi"
                )
            if partition.memory_bytes in sizes:
                raise NodeConfigError(
                    f"{setting}: two partition sizes with the same memory on {_describe(gpu)}"
                )
            sizes.add(partition.memory_bytes)
    if mode == "vgpu-capacity" and settings.memory_step > gpu.memory_bytes:
        raise NodeConfigError(
            f"{where}.vgpu.memoryStep: {settings.memory_step // MIB}Mi is more than {_describe(gpu)} has"
        )
    if mode == "mig-dynamic":
        known = {profile.name for profile in gpu.mig_profiles}
        if unknown := sorted(set(settings.mig_profiles) - known):
            raise NodeConfigError(
                f"{where}.mig.profiles: {unknown} not offered by {_describe(gpu)}; "
                f"its profiles: {', '.join(sorted(known))}"
            )


def plan_gpus(config: NodeConfig, gpus: Sequence[Gpu]) -> tuple[GpuPlan, ...]:
    """Decides each GPU's mode; raises NodeConfigError naming the GPU and the setting."""
    by_index = {gpu.index: gpu for gpu in gpus}
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    chosen: dict[str, tuple[GpuEntry, GpuSettings]] = {}
    for entry in config.gpus:
        gpu = by_index.get(entry.index) if entry.index is not None else by_uuid.get(entry.uuid or "")
        if gpu is None:
            present = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
            which = f"index {entry.index}" if entry.index is not None else f"uuid {entry.uuid}"
            raise NodeConfigError(f"{entry.where}: no GPU with {which} on this node; GPUs present: {present}")
        if gpu.uuid in chosen:
            raise NodeConfigError(
                f"{entry.where}: {_describe(gpu)} is already configured by {chosen[gpu.uuid][0].where}"
            )
        chosen[gpu.uuid] = (entry, entry.settings)
    plans = []
    for gpu in gpus:
        entry_and_settings = chosen.get(gpu.uuid)
        where, settings = (
            (entry_and_settings[0].where, entry_and_settings[1])
            if entry_and_settings
            else ("default", config.default)
        )
        mode = _resolve_mode(gpu, settings, where)
        _check_fits(gpu, mode, settings, where)
        plans.append(GpuPlan(gpu=gpu, mode=mode, settings=settings))
    return tuple(plans)
