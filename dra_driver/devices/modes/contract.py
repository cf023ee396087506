"""What every mode provides: the one shape the node config, the inventory, the fallbacks, the
planner, the layout pictures and the chart schema all read, so that none of them restates which
modes there are or what sets one apart (devices.modes.registry lists them).

Pure data and pure functions of the GPU and its settings: the agent and the offline tools
(`plan`, `validate-config`, the chart schema) must agree on every mode without a node.
"""

from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.model import CounterSet, Device, DeviceType
from dra_driver.devices.origins import DeviceOrigin
from dra_driver.hardware.model import Gpu

# A device together with what it stands for.
Offer = tuple[Device, DeviceOrigin]
# The node config's blocks of settings beyond `mode` and `packing` that a mode may take.
SettingsBlock = Literal["vgpu", "mig"]


class Unfit(msgspec.Struct, frozen=True):
    """A setting that cannot be applied to a GPU: `setting` is its path in the file, and the
    message says why (node_config turns it into the GPU's ConfigProblem)."""

    setting: str
    message: str


class Fallback(msgspec.Struct, frozen=True):
    """Where a GPU goes when the API server cannot store this mode's devices: `mode`, when the
    feature `gate` (a publish.capabilities ApiFeature, checked there) is off or misallocates."""

    mode: str
    gate: str


class PlanAsks(msgspec.Struct, frozen=True):
    """What the pods of a `plan` ask for, as far as a mode's settings depend on it: each vGPU
    shape's memory and cores (None: its share of memory), in the order given."""

    vgpus: tuple[tuple[int, int | None], ...] = ()


class DeviceMode(msgspec.Struct, frozen=True, kw_only=True):
    """One way of offering a GPU. Every field is required: a new mode states each part."""

    # The node config's `mode` value, and one line for `plan --help` and the docs.
    name: str
    description: str
    # True: the GPU must be in MIG mode; False: it must not be.
    in_mig_mode: bool
    # Mode auto picks this mode for a GPU whose MIG state it fits (one such mode per MIG state).
    auto: bool
    # The settings blocks the mode takes; "vgpu" also subjects it to vgpu.enforcement's checks.
    blocks: frozenset[SettingsBlock]
    # Whether it takes vgpu.partitions, which it then needs at least one of.
    partitions: bool
    # Why `packing: spread` is refused with this mode ("" where spread is allowed).
    no_spread: str
    # The mode's own checks of the settings against the GPU, `where` being the entry's path.
    fits: Callable[[Gpu, GpuSettings, str], Unfit | None]
    # The devices the GPU offers and their counter sets; notes gathers what an operator should
    # know (instances left out, and why).
    offers: Callable[[Gpu, GpuSettings, list[str]], tuple[list[Offer], list[CounterSet]]]
    # None: the server stores what it needs wherever the driver publishes at all.
    fallback: Fallback | None
    # The settings of a GPU moved into this mode by a fallback, which named none of its own.
    entered: Callable[[Gpu, GpuSettings], GpuSettings]
    # `plan`: the settings to plan the GPU with (in this mode's MIG state), None if it cannot be
    # offered so for these pods; whether the mode is worth a column for these GPUs and pods; and
    # why a GPU it cannot take is offered whole ("<GPU> <not_planned>; offered whole").
    planned: Callable[[Gpu, PlanAsks], GpuSettings | None]
    serves: Callable[[Sequence[Gpu], PlanAsks], bool]
    not_planned: str
    # The kind a GPU's layout picture is drawn as, and whether a GPU's published devices are
    # this mode's (the layout reads slices, which name no mode).
    layout_kind: str
    shown_by: Callable[[Sequence[Device]], bool]
    # The attribute names only this mode's devices publish, beyond devices/attributes.py's
    # (which every mode's devices draw on): the vocabulary a selector may name is both.
    own_attributes: frozenset[str]
    # The device types of this mode's devices that get no shipped DeviceClass (an operator
    # creates one): a kind not yet proven where it runs.
    unshipped_types: frozenset[DeviceType]


def no_misfit(gpu: Gpu, settings: GpuSettings, where: str) -> Unfit | None:
    """`fits` for a mode with no settings of its own to check."""
    return None


def settings_as_given(gpu: Gpu, settings: GpuSettings) -> GpuSettings:
    """`entered` for a mode whose settings need nothing a fallback cannot give."""
    return settings


def always(gpus: Sequence[Gpu], asks: PlanAsks) -> bool:
    """`serves` for a mode every GPU can be planned in."""
    return True
