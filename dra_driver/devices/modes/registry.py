"""The modes, in their documented order (docs/configuration.md): the one list that the node
config's decoding and planning, the inventory, the fallbacks, `plan`, the layout pictures and
the chart schema read. A new mode is a module of its own (contract.DeviceMode) and a line here.
"""

from collections.abc import Sequence
from typing import get_args

from dra_driver.devices import attributes
from dra_driver.devices.model import Device, DeviceType
from dra_driver.devices.modes import gpu, mig_dynamic, mig_static, vfio, vgpu_capacity, vgpu_partitions
from dra_driver.devices.modes.contract import DeviceMode, SettingsBlock
from dra_driver.hardware.model import Gpu, MigMode

MODES: tuple[DeviceMode, ...] = (
    gpu.MODE,
    mig_static.MODE,
    mig_dynamic.MODE,
    vgpu_capacity.MODE,
    vgpu_partitions.MODE,
    vfio.MODE,
)
# Not a mode of its own: the node config's default, which picks a mode by the GPU's MIG state.
AUTO = "auto"
MODE_NAMES: tuple[str, ...] = tuple(mode.name for mode in MODES)
# What the node config's `mode` accepts.
CONFIG_MODES: tuple[str, ...] = (AUTO, *MODE_NAMES)
_BY_NAME = {mode.name: mode for mode in MODES}


def find_mode(name: str) -> DeviceMode | None:
    return _BY_NAME.get(name)


def mode_named(name: str) -> DeviceMode:
    """For names already checked against the registry (decoded, or a GPU's plan); LookupError
    names the modes there are."""
    if (mode := _BY_NAME.get(name)) is None:
        raise LookupError(f"{name!r} is not a mode; the modes: {', '.join(MODE_NAMES)}")
    return mode


def auto_mode(gpu: Gpu) -> DeviceMode:
    """What mode auto offers the GPU as: the auto mode of its MIG state."""
    in_mig_mode = gpu.mig_mode is MigMode.ENABLED
    return next(mode for mode in MODES if mode.auto and mode.in_mig_mode == in_mig_mode)


def names_where(modes: Sequence[DeviceMode]) -> str:
    """Mode names for a message: "a", "a or b"."""
    return " or ".join(mode.name for mode in modes)


def mig_modes() -> tuple[DeviceMode, ...]:
    """The modes a GPU in MIG mode can be offered in."""
    return tuple(mode for mode in MODES if mode.in_mig_mode)


def taking(block: SettingsBlock) -> tuple[DeviceMode, ...]:
    """The modes that take a settings block (vgpu, mig)."""
    return tuple(mode for mode in MODES if block in mode.blocks)


def layout_kinds() -> tuple[str, ...]:
    """Every kind a GPU's layout can be, once each, in the modes' order."""
    return tuple(dict.fromkeys(mode.layout_kind for mode in MODES))


def layout_kind_of(devices: Sequence[Device]) -> str:
    """The layout kind of a GPU's published devices: the first mode's that recognises them;
    devices no mode recognises (another driver version's) are drawn as the first mode's."""
    return next((mode.layout_kind for mode in MODES if mode.shown_by(devices)), MODES[0].layout_kind)


def published_attributes() -> frozenset[str]:
    """Every attribute name a device of this driver may publish: the common vocabulary and each
    mode's own."""
    return attributes.PUBLISHED.union(*(mode.own_attributes for mode in MODES))


def shipped_class_types() -> tuple[DeviceType, ...]:
    """The device types whose DeviceClasses are shipped: every type but those a mode withholds."""
    withheld = frozenset().union(*(mode.unshipped_types for mode in MODES))
    return tuple(device_type for device_type in get_args(DeviceType) if device_type not in withheld)
