"""`dra-driver inspect`: what this node would offer, without a cluster.

Runs the same discovery, node configuration and slice planning as `node`, so an operator can
check a node configuration (or a simulated profile) before deploying, and `-o yaml` shows the
exact ResourceSlices the agent would publish.
"""

from collections.abc import Iterator
from typing import Any

import yaml

from dra_driver.devices import attributes as names
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device, quantity
from dra_driver.devices.slices import SliceLayout, plan_slices, slices_to_api

# NUMA is the standard resource.kubernetes.io/numaNode, what claims align other drivers' devices
# by; PARTITION-TYPE the value the slices' partitionTypeAttribute groups devices by.
_COLUMNS = ("DEVICE", "TYPE", "GPU", "NUMA", "PROFILE/SIZE", "MEMORY", "COMPUTE", "PARTITION-TYPE", "SHARING")


def _compute(device: Device) -> str:
    if "cores" in device.capacity:
        return f"{device.capacity['cores'].value}% cores"
    if "multiprocessors" in device.capacity:
        return f"{device.capacity['multiprocessors'].value} SMs"
    return ""


def _sharing(device: Device) -> str:
    if device.allow_multiple_allocations:
        return "shared (consumable capacity)"
    if device.consumes_counters:
        return f"counters of {', '.join(c.counter_set for c in device.consumes_counters)}"
    return "exclusive"


def _row(device: Device, inventory: Inventory) -> tuple[str, ...]:
    gpu = inventory.gpu_of_device[device.name]
    profile = device.attributes.get(names.PROFILE, "")
    if device.type == "vgpu" and not device.allow_multiple_allocations:
        profile = quantity(device.capacity["memory"].value)
    return (
        device.name,
        device.type,
        f"{gpu.index} {gpu.product_name}",
        str(device.attributes.get(names.STANDARD_NUMA_NODE, "")),
        str(profile),
        quantity(device.capacity["memory"].value),
        _compute(device),
        str(device.attributes.get(names.PARTITION_TYPE, "")),
        _sharing(device),
    )


def _aligned(rows: list[tuple[str, ...]]) -> Iterator[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        yield "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


def inventory_table(inventory: Inventory, hardware_description: str) -> str:
    lines = [f"hardware: {hardware_description}"]
    lines += [f"{plan.gpu.label}: {plan.mode}" for plan in inventory.plans]
    lines += [f"note: {note}" for note in inventory.notes]
    lines.append("")
    lines += _aligned([_COLUMNS, *(_row(device, inventory) for device in inventory.devices)])
    lines.append(f"{len(inventory.devices)} devices, {len(inventory.counter_sets)} counter sets")
    return "\n".join(lines) + "\n"


def slices_yaml(
    inventory: Inventory, layout: SliceLayout, driver_name: str, node_name: str, partition_types: bool = False
) -> str:
    """`partition_types`: as the agent sends them to a server of that version (see
    publish.capabilities.sends_partition_types); one with the alpha gate off drops them."""
    objects: list[dict[str, Any]] = slices_to_api(
        plan_slices(inventory, layout), driver_name, node_name, partition_types=partition_types
    )
    return yaml.safe_dump_all(objects, sort_keys=False)
