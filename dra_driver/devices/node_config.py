"""The node configuration file: how each GPU of the node is offered (whole, MIG, vGPU).

Decoded strictly (node_config_decode.py), then planned here against the discovered GPUs. A GPU
the file cannot be applied to is left out (a `ConfigProblem` names the GPU and the setting)
rather than offered in a mode nobody asked for, or publishing devices that can never be
prepared; the other GPUs go on.
"""

from collections.abc import Sequence

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.base.strict_decode import (
    quoted,
)
from dra_driver.devices.gpu_selection import select_entries
from dra_driver.devices.gpu_settings import (
    MIB,
    Enforcement,
    GpuSettings,
    Mode,
    ResolvedMode,
    VgpuPartitionSize,
    describe_gpu,
)
from dra_driver.devices.modes.contract import DeviceMode
from dra_driver.devices.modes.registry import AUTO, CONFIG_MODES, auto_mode, find_mode, mig_modes, names_where
from dra_driver.hardware.model import Gpu, MigMode

# The settings' names too: node_config is where the rest of the code (and the tests) read the
# node config's vocabulary from, although the settings sit below the modes (gpu_settings).
__all__ = [
    "HAMI_CORE_SETTING",
    "MIB",
    "MODES",
    "ConfigProblem",
    "Enforcement",
    "GpuEntry",
    "GpuPlan",
    "GpuSettings",
    "Mode",
    "NodeConfig",
    "NodeConfigError",
    "NodePlan",
    "ResolvedMode",
    "VgpuPartitionSize",
    "describe_gpu",
    "hami_core_missing",
    "plan_gpus",
    "plan_node",
]
# What the node config's `mode` accepts: auto, then every registered mode.
MODES: tuple[str, ...] = CONFIG_MODES
HAMI_CORE_SETTING = "vgpu.enforcement"
# A selector longer than this is quoted and cut short in messages (a UUID is 40 characters).
_SHOWN_MAX = 80


class NodeConfigError(OperatorFault, ValueError):
    """The node configuration is malformed or does not fit this node's GPUs: one line per problem."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Misfit(OperatorFault):
    """A setting that cannot be applied to one GPU; `setting` is its path in the file."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


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


def _resolve_mode(gpu: Gpu, settings: GpuSettings, where: str) -> DeviceMode:
    name = settings.mode
    setting = f"{where}.mode"
    if name == AUTO:
        return auto_mode(gpu)
    mode = find_mode(name)
    if mode is None:
        raise _Misfit(setting, f"{quoted(name)} is not one of {', '.join(MODES)}")
    if mode.in_mig_mode:
        if gpu.mig_mode is MigMode.UNSUPPORTED:
            raise _Misfit(setting, f"{name} on {describe_gpu(gpu)}: this GPU does not support MIG")
        if gpu.mig_mode is MigMode.DISABLED:
            raise _Misfit(
                setting,
                f"{name} on {describe_gpu(gpu)}: MIG mode is disabled on this GPU; "
                f"enable it first (nvidia-smi -i {gpu.index} -mig 1)",
            )
    elif gpu.mig_mode is MigMode.ENABLED:
        raise _Misfit(
            setting,
            f"{name} on {describe_gpu(gpu)}: MIG mode is enabled, so the GPU cannot be used "
            f"whole or shared; use mode {names_where(mig_modes())}, or disable MIG mode",
        )
    return mode


def _check_fits(gpu: Gpu, mode: DeviceMode, settings: GpuSettings, where: str, hami_core: bool) -> None:
    """The check every mode that takes vGPU settings shares, then the mode's own."""
    if "vgpu" in mode.blocks and settings.enforcement == "hami-core" and not hami_core:
        raise _Misfit(
            f"{where}.{HAMI_CORE_SETTING}",
            f"hami-core on {describe_gpu(gpu)} needs --hami-core-library, which this node's agent "
            "was not given, so every share's prepare would be refused; set it, or choose "
            "vgpu.enforcement mps or none",
        )
    if (unfit := mode.fits(gpu, settings, where)) is not None:
        raise _Misfit(unfit.setting, unfit.message)


def _plan_one(gpu: Gpu, where: str, settings: GpuSettings, hami_core: bool) -> GpuPlan | ConfigProblem:
    try:
        mode = _resolve_mode(gpu, settings, where)
        _check_fits(gpu, mode, settings, where, hami_core)
    except _Misfit as misfit:
        return ConfigProblem(misfit.setting, str(misfit), gpu)
    return GpuPlan(gpu=gpu, mode=mode.name, settings=settings)


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
