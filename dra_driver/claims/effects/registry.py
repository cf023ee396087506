"""The side effects a node's claims can have, in the order prepare makes them: the one list the
engine loops over (unprepare and the rollback undo in the reverse order). A new side effect is
its module, its entry in effect_entries, and one line here."""

from collections.abc import Callable, Collection
from typing import Any

import msgspec

from dra_driver.claims.edits.vgpu_edits import HamiCore
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.effects.claim_mps import ClaimMpsDaemons
from dra_driver.claims.effects.compute_mode import ExclusiveProcessModes
from dra_driver.claims.effects.contract import SideEffect
from dra_driver.claims.effects.gpu_mps_share import GpuMpsShares
from dra_driver.claims.effects.hami_core import HamiCoreDirectories
from dra_driver.claims.effects.mig_instance import MigInstances
from dra_driver.claims.effects.time_slice import TimeSlices
from dra_driver.claims.effects.vfio import VfioBindings
from dra_driver.claims.sharing.gpu_mps_daemons import GpuMpsDaemons
from dra_driver.claims.sharing.mps import MpsDaemonRunner
from dra_driver.hardware.backend import ComputeModes, HardwareBackend
from dra_driver.hardware.pci_binding import PciBinding
from dra_driver.hardware.time_slicing import TimeSlicer


class SharingControls(msgspec.Struct, frozen=True):
    """Where time slices are set and MPS daemons run (per backend: nvidia-smi and the driver's
    MPS control program, or their simulated stand-ins)."""

    time_slicer: TimeSlicer
    mps: MpsDaemonRunner
    # Where whole GPUs' compute modes are set for MPS (None: left as they are).
    compute_modes: ComputeModes | None = None


class EffectControls(msgspec.Struct, frozen=True):
    """What the node's side effects act through, as its platform gives it (agent/gpu_platform.py,
    or a test's engine): a new effect's hardware is a field here and a line where the platform
    makes it, not a parameter threaded through the engine. None: the node has none of it."""

    # Where MIG instances are created (None: a node without dynamic MIG).
    hardware: HardwareBackend | None = None
    sharing: SharingControls | None = None
    # Where GPUs are bound to vfio-pci for VMs (mode vfio).
    pci: PciBinding | None = None


class NodeControls(msgspec.Struct, frozen=True):
    """The platform's controls and what the engine adds to them; None where the node has none."""

    pool_name: str
    platform: EffectControls
    hami_core: HamiCore | None
    gpu_mps: GpuMpsDaemons | None
    # The published device a MIG instance stands for, and the node's GPUs, for log lines and sweeps.
    mig_device_name: Callable[[MigInstanceEntry], str]
    gpu_uuids: Callable[[], Collection[str]]


def node_effects(node: NodeControls) -> tuple[SideEffect[Any], ...]:
    """The node's side effects, in the order prepare makes them (those the node cannot make are
    left out, and the claims that would need them are refused by the effects that remain)."""
    sharing = node.platform.sharing
    effects: list[SideEffect[Any] | None] = [
        MigInstances(node.platform.hardware, node.pool_name, node.mig_device_name),
        VfioBindings(node.platform.pci),
        None if sharing is None else TimeSlices(sharing.time_slicer),
        None
        if sharing is None or sharing.compute_modes is None
        else ExclusiveProcessModes(sharing.compute_modes),
        None if sharing is None else ClaimMpsDaemons(sharing.mps, node.gpu_mps, node.gpu_uuids),
        GpuMpsShares(node.gpu_mps, node.gpu_uuids),
        None if node.hami_core is None else HamiCoreDirectories(node.hami_core),
    ]
    return tuple(effect for effect in effects if effect is not None)
