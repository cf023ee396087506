"""Published devices counted by type and health: what the devices gauge of the metrics shows.

Here, beside the health model, because the count joins the inventory with the health report;
the metrics take the result as plain label values and import neither.
"""

from collections import Counter
from typing import get_args

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import DeviceType
from dra_driver.health.model import HealthStatus, NodeHealth

DEVICE_TYPES: tuple[DeviceType, ...] = get_args(DeviceType)


def device_counts(
    inventory: Inventory, node_health: NodeHealth
) -> dict[tuple[DeviceType, HealthStatus], int]:
    """Published devices by (type, health), every combination present (zero where none).

    A device the health report does not name counts as unknown, as kubelet shows it: healthy
    would claim a check that never happened."""
    tally = Counter(
        (
            device.type,
            health.status if (health := node_health.devices.get(device.name)) else HealthStatus.UNKNOWN,
        )
        for device in inventory.devices
    )
    return {(kind, status): tally[kind, status] for kind in DEVICE_TYPES for status in HealthStatus}


def device_labels(inventory: Inventory, node_health: NodeHealth) -> dict[tuple[str, str], int]:
    """`device_counts` keyed by the gauge's label values."""
    return {
        (kind, status.value): count for (kind, status), count in device_counts(inventory, node_health).items()
    }
