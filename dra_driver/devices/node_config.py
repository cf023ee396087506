"""The node configuration file: how each GPU of the node is offered (whole, MIG, vGPU).

Decoded strictly, then planned against the discovered GPUs. A GPU the file cannot be applied to
is left out (a `ConfigProblem` names the GPU and the setting) rather than offered in a mode
nobody asked for, or publishing devices that can never be prepared; the other GPUs go on.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import msgspec

from dra_driver.base.quantity import UP_TO_TERA, parse_quantity
from dra_driver.base.strict_decode import (
    DecodeError,
    choice,
    items,
    literal_options,
    mapping,
    quoted,
)
from dra_driver.devices.gpu_selection import select_entries
from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import Gpu, MigMode

Mode = Literal["auto", "gpu", "mig-static", "mig-dynamic", "vgpu-capacity", "vgpu-partitions"]
ResolvedMode = Literal["gpu", "mig-static", "mig-dynamic", "vgpu-capacity", "vgpu-partitions"]
# What holds a vGPU share to its limits. mps: NVIDIA's MPS, one control daemon per GPU, which
# enforced both the SM share and the memory limit on the H200 (docs/hardware.md); hami-core: the
# preloaded HAMi-core library, which held memory there but not compute; none: the limits are
# only advisory environment variables.
Enforcement = Literal["mps", "hami-core", "none"]
MODES: tuple[str, ...] = get_args(Mode)
HAMI_CORE_SETTING = "vgpu.enforcement"
MIB = 2**20
# A selector longer than this is quoted and cut short in messages (a UUID is 40 characters).
_SHOWN_MAX = 80


class NodeConfigError(ValueError):
    """The node configuration is malformed or does not fit this node's GPUs: one line per problem."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Misfit(Exception):
    """A setting that cannot be applied to one GPU; `setting` is its path in the file."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


class VgpuPartitionSize(msgspec.Struct, frozen=True):
    memory_bytes: int
    # Percent of the GPU's SMs; None = the partition's share of memory.
    cores: int | None = None


class GpuSettings(msgspec.Struct, frozen=True):
    mode: Mode = "auto"
    # Capacity mode: the granularity of memory requests.
    memory_step: int = MIB
    partitions: tuple[VgpuPartitionSize, ...] = ()
    # Dynamic MIG: profile names to publish; empty = all.
    mig_profiles: tuple[str, ...] = ()
    # Where the scheduler's first fit puts claims that share GPUs (devices.order).
    packing: PackingPolicy = "binpack"
    # vGPU modes: how shares are held to their limits.
    enforcement: Enforcement = "mps"


class GpuEntry(msgspec.Struct, frozen=True):
    """One `gpus[]` entry; exactly one of index, uuid, model and product_name is set."""

    where: str
    index: int | None
    uuid: str | None
    settings: GpuSettings
    # A key of the GPU catalog (hardware/catalog/gpus.yaml), e.g. A100-SXM4-80GB.
    model: str | None = None
    # NVML's name of the GPU, e.g. "NVIDIA L4".
    product_name: str | None = None

    @property
    def names_one_gpu(self) -> bool:
        """index/uuid entries name one GPU of one node and win over model/productName entries,
        which name every GPU of a kind on any node of a fleet."""
        return self.index is not None or self.uuid is not None

    @property
    def selector(self) -> str:
        if self.index is not None:
            return f"index {self.index}"
        if self.uuid is not None:
            return f"uuid {self.uuid if len(self.uuid) <= _SHOWN_MAX else quoted(self.uuid)}"
        if self.model is not None:
            return f"model {self.model}"
        return f"productName {quoted(self.product_name or '')}"


class NodeConfig(msgspec.Struct, frozen=True):
    default: GpuSettings = msgspec.field(default_factory=GpuSettings)
    gpus: tuple[GpuEntry, ...] = ()


class GpuPlan(msgspec.Struct, frozen=True):
    """What the device model does with one GPU, decided and checked."""

    gpu: Gpu
    mode: ResolvedMode
    settings: GpuSettings


class ConfigProblem(msgspec.Struct, frozen=True):
    """A part of the node config that cannot be applied. `gpu`: the GPU left out because of it
    (None: a problem of the file as a whole, or an entry that names no GPU of this node)."""

    setting: str
    message: str
    gpu: Gpu | None = None


class NodePlan(msgspec.Struct, frozen=True):
    """The GPUs offered (in GPU order) and why any others are not."""

    plans: tuple[GpuPlan, ...]
    problems: tuple[ConfigProblem, ...] = ()


def _bytes(value: object, where: str) -> int:
    """Whole bytes up to Ti/T, written without leading zeros (YAML 1.1 reads 010 as octal)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    quantity = parse_quantity(text) if isinstance(text, str) else None
    total = quantity.whole_number(UP_TO_TERA) if quantity is not None else None
    if quantity is None or total is None or (quantity.whole.startswith("0") and quantity.whole != "0"):
        raise NodeConfigError(
            f"{where}: expected a whole number of bytes such as 10Gi, 512Mi or 1073741824, "
            f"got {quoted(value)}"
        )
    return total


def _mapping(raw: object, where: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    try:
        return mapping(raw, where, allowed)
    except DecodeError as error:
        raise NodeConfigError(f"{error.path or 'node config'}: {error.problem}") from error


def _list(raw: object, where: str) -> list[Any]:
    try:
        return items(raw, where)
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error


def _partition(raw: object, where: str) -> VgpuPartitionSize:
    fields = _mapping(raw, where, ("memory", "cores"))
    if "memory" not in fields:
        raise NodeConfigError(f"{where}.memory: required (the partition's memory, e.g. 10Gi)")
    memory = _bytes(fields["memory"], f"{where}.memory")
    if memory < MIB or memory % MIB:
        raise NodeConfigError(
            f"{where}.memory: must be a positive whole number of MiB, got {quoted(fields['memory'])}"
        )
    cores = fields.get("cores")
    if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool) or not 1 <= cores <= 100):
        raise NodeConfigError(
            f"{where}.cores: expected an integer percentage from 1 to 100, got {quoted(cores)}"
        )
    return VgpuPartitionSize(memory, cores)


def _settings(raw: Mapping[str, Any], where: str) -> GpuSettings:
    try:
        mode: Mode = choice(raw.get("mode", "auto"), f"{where}.mode", literal_options(Mode))
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error
    vgpu = _mapping(raw.get("vgpu", {}), f"{where}.vgpu", ("memoryStep", "partitions", "enforcement"))
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
    try:
        enforcement: Enforcement = choice(
            vgpu.get("enforcement", "mps"), f"{where}.vgpu.enforcement", literal_options(Enforcement)
        )
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error
    profiles = _list(mig.get("profiles", []), f"{where}.mig.profiles")
    for number, name in enumerate(profiles):
        if not isinstance(name, str):
            raise NodeConfigError(
                f"{where}.mig.profiles: expected profile names such as 1g.10gb, "
                f"got {quoted(name)} at [{number}]"
            )
    return GpuSettings(
        mode=mode,
        memory_step=memory_step,
        partitions=partitions,
        mig_profiles=tuple(profiles),
        packing=_packing(raw, mode, where),
        enforcement=enforcement,
    )


def _packing(raw: Mapping[str, Any], mode: Mode, where: str) -> PackingPolicy:
    try:
        packing: PackingPolicy = choice(
            raw.get("packing", "binpack"), f"{where}.packing", literal_options(PackingPolicy)
        )
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error
    if packing == "spread" and mode == "vgpu-capacity":
        raise NodeConfigError(
            f"{where}.packing: spread needs a device per tenant slot (mode vgpu-partitions or "
            "mig-dynamic); with vgpu-capacity each GPU is one device and the scheduler fills the "
            "first GPU that fits"
        )
    return packing


_SETTINGS_FIELDS = ("mode", "vgpu", "mig", "packing")
_SELECTORS = ("index", "uuid", "model", "productName")


def _entry(raw: object, where: str) -> GpuEntry:
    fields = _mapping(raw, where, (*_SELECTORS, *_SETTINGS_FIELDS))
    given = [name for name in _SELECTORS if fields.get(name) is not None]
    if len(given) != 1:
        raise NodeConfigError(
            f"{where}: set exactly one of 'index', 'uuid', 'model' or 'productName' to say which GPUs "
            f"this is for, got {given or 'none'}"
        )
    index, uuid, model, product_name = (fields.get(name) for name in _SELECTORS)
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        raise NodeConfigError(f"{where}.index: expected a GPU index (an integer ≥ 0), got {quoted(index)}")
    if uuid is not None and not isinstance(uuid, str):
        raise NodeConfigError(f"{where}.uuid: expected a GPU UUID string such as GPU-…, got {quoted(uuid)}")
    if model is not None and (not isinstance(model, str) or model not in gpu_models()):
        raise NodeConfigError(
            f"{where}.model: {quoted(model)} is not a GPU model of the catalog; "
            f"known: {', '.join(gpu_models())}"
        )
    if product_name is not None and (not isinstance(product_name, str) or not product_name.strip()):
        raise NodeConfigError(
            f"{where}.productName: expected the GPU's name as nvidia-smi shows it, such as 'NVIDIA L4', "
            f"got {quoted(product_name)}"
        )
    return GpuEntry(
        where=where,
        index=index,
        uuid=uuid,
        settings=_settings(fields, where),
        model=model,
        product_name=product_name,
    )


def _conflicts(entry: GpuEntry) -> tuple[tuple[str, object], ...]:
    """The keys under which an earlier entry of equal rank would select the same GPUs as this one.
    A model entry and a productName entry of the model's product name select the same GPUs; two
    models never do (should two models share a product name, the GPU's memory tells them apart)."""
    if entry.index is not None:
        return (("index", entry.index),)
    if entry.uuid is not None:
        return (("uuid", entry.uuid),)
    if entry.model is not None:
        return (("model", entry.model), ("productName", gpu_models()[entry.model].product_name))
    return (("productName", entry.product_name), ("model of productName", entry.product_name))


def _registered(entry: GpuEntry) -> tuple[tuple[str, object], ...]:
    """The keys this entry answers to for the entries after it."""
    if entry.model is not None:
        return (("model", entry.model), ("model of productName", gpu_models()[entry.model].product_name))
    return _conflicts(entry)[:1]


def duplicate_problems(entries: Sequence[GpuEntry]) -> list[str]:
    """Entries that select the same GPUs with equal rank: on any node with such a GPU neither can
    win, so the GPU would be left out. The same index, the same uuid, the same model, the same
    productName, or a model and its product name. (An index and a uuid naming one GPU can only be
    told on the node; `plan_node` reports those.)"""
    seen: dict[tuple[str, object], GpuEntry] = {}
    problems = []
    for entry in entries:
        earlier = next((seen[key] for key in _conflicts(entry) if key in seen), None)
        if earlier is not None:
            problems.append(
                f"{entry.where}: selects the same GPUs as {earlier.where} ({earlier.selector}); "
                "give each GPU or kind of GPU one entry"
            )
        for key in _registered(entry):
            seen.setdefault(key, entry)
    return problems


def _default(fields: Mapping[str, Any]) -> GpuSettings:
    return _settings(_mapping(fields.get("default", {}), "default", _SETTINGS_FIELDS), "default")


def parse_node_config(raw: object, origin: str) -> NodeConfig:
    """Raises NodeConfigError with one line per malformed part (the default, each entry), each
    starting with `origin`: an operator sees every problem of the file at once."""
    if raw is None:
        return NodeConfig()
    problems: list[str] = []
    default = GpuSettings()
    entries: list[GpuEntry] = []
    try:
        fields = _mapping(raw, "", ("default", "gpus"))
        try:
            default = _default(fields)
        except NodeConfigError as error:
            problems.extend(error.problems)
        for number, entry in enumerate(_list(fields.get("gpus", []), "gpus")):
            try:
                entries.append(_entry(entry, f"gpus[{number}]"))
            except NodeConfigError as error:
                problems.extend(error.problems)
    except NodeConfigError as error:
        problems.extend(error.problems)
    problems.extend(duplicate_problems(entries))
    if problems:
        raise NodeConfigError(*(f"{origin}: {problem}" for problem in problems))
    return NodeConfig(default=default, gpus=tuple(entries))


def describe_gpu(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.product_name}, {gpu.uuid})"


def _resolve_mode(gpu: Gpu, settings: GpuSettings, where: str) -> ResolvedMode:
    mode = settings.mode
    setting = f"{where}.mode"
    if mode == "auto":
        return "mig-static" if gpu.mig_mode is MigMode.ENABLED else "gpu"
    if mode.startswith("mig-"):
        if gpu.mig_mode is MigMode.UNSUPPORTED:
            raise _Misfit(setting, f"{mode} on {describe_gpu(gpu)}: this GPU does not support MIG")
        if gpu.mig_mode is MigMode.DISABLED:
            raise _Misfit(
                setting,
                f"{mode} on {describe_gpu(gpu)}: MIG mode is disabled on this GPU; "
                f"enable it first (nvidia-smi -i {gpu.index} -mig 1)",
            )
    elif gpu.mig_mode is MigMode.ENABLED:
        raise _Misfit(
            setting,
            f"{mode} on {describe_gpu(gpu)}: MIG mode is enabled, so the GPU cannot be used "
            "whole or shared; use mode mig-static or mig-dynamic, or disable MIG mode",
        )
    return mode


def _check_fits(gpu: Gpu, mode: ResolvedMode, settings: GpuSettings, where: str, hami_core: bool) -> None:
    if mode.startswith("vgpu-") and settings.enforcement == "hami-core" and not hami_core:
        raise _Misfit(
            f"{where}.{HAMI_CORE_SETTING}",
            f"hami-core on {describe_gpu(gpu)} needs --hami-core-library, which this node's agent "
            "was not given, so every share's prepare would be refused; set it, or choose "
            "vgpu.enforcement mps or none",
        )
    if mode == "vgpu-partitions":
        sizes = set()
        for number, partition in enumerate(settings.partitions):
            setting = f"{where}.vgpu.partitions[{number}].memory"
            if partition.memory_bytes > gpu.memory_bytes:
                raise _Misfit(
                    setting,
                    f"{partition.memory_bytes // MIB}Mi does not fit {describe_gpu(gpu)}, "
                    f"which has {gpu.memory_bytes // MIB}Mi",
                )
            if partition.memory_bytes in sizes:
                raise _Misfit(setting, f"two partition sizes with the same memory on {describe_gpu(gpu)}")
            sizes.add(partition.memory_bytes)
    if mode == "vgpu-capacity" and settings.memory_step > gpu.memory_bytes:
        raise _Misfit(
            f"{where}.vgpu.memoryStep",
            f"{settings.memory_step // MIB}Mi is more than {describe_gpu(gpu)} has",
        )
    if mode == "mig-dynamic":
        known = {profile.name for profile in gpu.mig_profiles}
        if unknown := sorted(set(settings.mig_profiles) - known):
            raise _Misfit(
                f"{where}.mig.profiles",
                f"[{', '.join(quoted(name) for name in unknown)}] not offered by {describe_gpu(gpu)}; "
                f"its profiles: {', '.join(sorted(known))}",
            )


def _plan_one(gpu: Gpu, where: str, settings: GpuSettings, hami_core: bool) -> GpuPlan | ConfigProblem:
    try:
        mode = _resolve_mode(gpu, settings, where)
        _check_fits(gpu, mode, settings, where, hami_core)
    except _Misfit as misfit:
        return ConfigProblem(misfit.setting, str(misfit), gpu)
    return GpuPlan(gpu=gpu, mode=mode, settings=settings)


def plan_node(config: NodeConfig, gpus: Sequence[Gpu], *, hami_core: bool = True) -> NodePlan:
    """Decides each GPU's mode. A GPU whose settings do not fit it, or that two entries of equal
    rank both configure, is left out with a problem; so is nothing else. `hami_core`: whether
    the node's agent has HAMi-core (--hami-core-library); without it vgpu.enforcement hami-core
    does not fit. True for the tools that cannot know (inspect, plan); the agent always says."""
    selection = select_entries(config.gpus, gpus)
    problems = [
        ConfigProblem(
            f"{entry.where}.{'index' if entry.index is not None else 'uuid'}",
            f"{entry.where}: no GPU with {entry.selector} on this node; GPUs present: "
            f"{', '.join(f'{g.index} ({g.uuid})' for g in gpus) or 'none'}",
        )
        for entry in selection.unmatched
    ]
    plans = []
    for gpu in gpus:
        entries = selection.entries_of_gpu.get(gpu.uuid, ())
        if len(entries) > 1:
            problems.append(
                ConfigProblem(
                    entries[1].where,
                    f"{entries[1].where}: {describe_gpu(gpu)} is already configured by {entries[0].where}",
                    gpu,
                )
            )
            continue
        outcome = (
            _plan_one(gpu, entries[0].where, entries[0].settings, hami_core)
            if entries
            else _plan_one(gpu, "default", config.default, hami_core)
        )
        if isinstance(outcome, ConfigProblem):
            problems.append(outcome)
        else:
            plans.append(outcome)
    return NodePlan(tuple(plans), tuple(problems))


def hami_core_missing(problems: Sequence[ConfigProblem]) -> tuple[Gpu, ...]:
    """The GPUs left out because their shares need HAMi-core the agent was not given: the only
    misfit at that setting, since the enforcement's value is checked when the file is read."""
    return tuple(p.gpu for p in problems if p.gpu is not None and p.setting.endswith(f".{HAMI_CORE_SETTING}"))


def plan_gpus(config: NodeConfig, gpus: Sequence[Gpu]) -> tuple[GpuPlan, ...]:
    """Every GPU's plan, or NodeConfigError naming each GPU and setting that does not fit; for
    the tools that check a config (`inspect`), where leaving a GPU out would hide the mistake."""
    node_plan = plan_node(config, gpus)
    if node_plan.problems:
        raise NodeConfigError(*(problem.message for problem in node_plan.problems))
    return node_plan.plans
