"""The node's inventory: every device it offers, the counter sets they draw from, and what each
device stands for. A pure function of the hardware snapshot and the node configuration."""

from collections.abc import Mapping, Sequence

import msgspec

from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.modes.contract import Offer
from dra_driver.devices.modes.registry import mode_named
from dra_driver.devices.naming import natural_key
from dra_driver.devices.node_config import GpuPlan, NodeConfig, plan_gpus
from dra_driver.devices.order import ordered_devices
from dra_driver.devices.origins import DeviceOrigin, DynamicMig
from dra_driver.hardware.model import Gpu


class Inventory(msgspec.Struct, frozen=True):
    """What this node offers: devices in publishing order (`devices.order`), counter sets, and
    what each device stands for."""

    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...]
    device_by_name: Mapping[str, Device]
    # The typed facts behind each device, by device name: what prepare reads (never the attributes).
    origin_of_device: Mapping[str, DeviceOrigin]
    gpu_of_device: Mapping[str, Gpu]
    plans: tuple[GpuPlan, ...]
    # Things an operator should know (instances left out, and why).
    notes: tuple[str, ...] = ()

    def dynamic_mig_name(self, gpu_uuid: str, profile_id: int, placement_start: int) -> str | None:
        """The published name of a dynamic MIG placement, for messages about its instance."""
        return next(
            (
                name
                for name, origin in self.origin_of_device.items()
                if isinstance(origin, DynamicMig)
                and origin.gpu.uuid == gpu_uuid
                and origin.profile.profile_id == profile_id
                and origin.placement.start == placement_start
            ),
            None,
        )


def build_inventory(plans: Sequence[GpuPlan]) -> Inventory:
    offers: list[Offer] = []
    counter_sets: list[CounterSet] = []
    notes: list[str] = []
    for plan in plans:
        gpu_offers, gpu_counter_sets = mode_named(plan.mode).offers(plan.gpu, plan.settings, notes)
        offers.extend(gpu_offers)
        counter_sets.extend(gpu_counter_sets)
    devices = [device for device, _ in offers]
    return Inventory(
        # The scheduler tries devices in this order: it is the node's packing policy.
        devices=ordered_devices(offers, {plan.gpu.uuid: plan.settings.packing for plan in plans}),
        device_by_name={device.name: device for device in devices},
        counter_sets=tuple(sorted(counter_sets, key=lambda counter_set: natural_key(counter_set.name))),
        origin_of_device={device.name: origin for device, origin in offers},
        gpu_of_device={device.name: origin.gpu for device, origin in offers},
        plans=tuple(plans),
        notes=tuple(notes),
    )


def node_inventory(gpus: Sequence[Gpu], config: NodeConfig) -> Inventory:
    """Raises NodeConfigError when the configuration does not fit the GPUs."""
    return build_inventory(plan_gpus(config, gpus))
