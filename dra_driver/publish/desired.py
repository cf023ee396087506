"""What the node's slices should say, decided in one place.

A pure function of the GPUs' plans (hardware and node config), what the API server was found
to store (its slice layout and the feature gates it has off) and the health state. The node
agent calls it whenever one of them changes and hands the answer on: the untainted inventory
to the claim engine, the tainted one to the ResourceSlice controller, which only applies it.
Kubernetes' per-version limits are the slice plan's (`devices.slices`); this adds nothing to them.
"""

from collections.abc import Sequence

import msgspec

from dra_driver.devices.inventory import Inventory, build_inventory
from dra_driver.devices.node_config import GpuPlan
from dra_driver.devices.slices import SliceLayout
from dra_driver.health.taints import tainted_inventory
from dra_driver.health.tracker import HealthState
from dra_driver.publish.capabilities import ApiFeature, fall_back

# Until the server's version is read: taints are then made for the newer layout, and the slice
# plan, which always knows the real layout, keeps them within its limits.
ASSUMED_LAYOUT: SliceLayout = "1.35"


class ApiCapabilities(msgspec.Struct, frozen=True):
    """What the API server stores: its slice layout (None until its version is read) and the
    features whose fields it drops."""

    layout: SliceLayout | None = None
    unsupported: frozenset[ApiFeature] = frozenset()
    # (major, minor), once read: some releases' schedulers misallocate a feature they store.
    kubernetes_version: tuple[int, int] | None = None


class DesiredPool(msgspec.Struct, frozen=True):
    # What claims are prepared against: every GPU in a mode the server stores whole.
    offered: Inventory
    # `offered` with the taints of the GPUs' faults: what the slices should say.
    published: Inventory
    # One line per GPU offered in another mode than planned, because the server lacks a feature.
    notes: tuple[str, ...] = ()


def desired_pool(
    plans: Sequence[GpuPlan], capabilities: ApiCapabilities, health: HealthState, driver_name: str
) -> DesiredPool:
    """Deterministic and side-effect free: the same inputs give an equal pool."""
    plans, notes = fall_back(plans, capabilities.unsupported, capabilities.kubernetes_version)
    offered = build_inventory(plans)
    layout = capabilities.layout or ASSUMED_LAYOUT
    return DesiredPool(offered, tainted_inventory(offered, health, driver_name, layout), notes)
