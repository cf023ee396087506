"""The partition-type attribute and the slices that name it (ResourceSlice partitionTypeAttribute,
Kubernetes 1.37 alpha): upstream's pool status controller groups counter-consuming devices by its
value and flags the pool when devices of one value cost different counters."""

from functools import cache

import pytest

from dra_driver.devices.attributes import PARTITION_TYPE
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.model import Device
from dra_driver.devices.slices import plan_slices, slices_to_api
from tests.support.nodes import all_profiles, inventory_for, mode_configs, simulated_node

DRIVER = "gpu.dra-driver.dev"


@cache
def inventories() -> dict[str, Inventory]:
    found = {}
    for profile in all_profiles():
        gpus = simulated_node(profile)
        for mode, config in mode_configs(gpus).items():
            found[f"{profile}/{mode}"] = node_inventory(gpus, config)
    return found


def cost(device: Device) -> frozenset[tuple[str, str, int]]:
    """What upstream compares within a partition type: counter set, counter name and amount."""
    return frozenset(
        (consumption.counter_set, counter, amount)
        for consumption in device.consumes_counters
        for counter, amount in consumption.counters.items()
    )


@pytest.mark.parametrize("name", sorted(inventories()))
def test_devices_of_one_partition_type_cost_the_same_counters(name: str) -> None:
    costs: dict[object, set[frozenset[tuple[str, str, int]]]] = {}
    for device in inventories()[name].devices:
        if PARTITION_TYPE in device.attributes:
            assert device.consumes_counters, device.name
            costs.setdefault(device.attributes[PARTITION_TYPE], set()).add(cost(device))
    assert all(len(found) == 1 for found in costs.values()), costs


def test_vgpu_partitions_and_their_whole_gpu_carry_it_and_mig_placements_do_not() -> None:
    partitions = inventories()["dgx-h100/vgpu-partitions"].devices
    mig = inventories()["dgx-h100-mig/mig-dynamic"].devices

    assert {
        device.attributes.get(PARTITION_TYPE) for device in partitions if device.name.startswith("gpu-0")
    } == {
        "gpu-0",
        "gpu-0-vgpu-19gi",
        "gpu-0-vgpu-1gi",
    }
    assert all(device.consumes_counters for device in mig)
    assert not any(PARTITION_TYPE in device.attributes for device in mig)


def test_only_slices_whose_counter_consuming_devices_all_carry_it_name_it() -> None:
    inventory = inventory_for("dgx-h100", "vgpu-partitions")
    plan = plan_slices(inventory, "1.35")

    named = [
        body
        for body in slices_to_api(plan, DRIVER, "node-a", partition_types=True)
        if "partitionTypeAttribute" in body["spec"]
    ]

    assert [body["spec"]["partitionTypeAttribute"] for body in named] == [f"{DRIVER}/partitionType"] * sum(
        1 for planned in plan if planned.devices
    )
    assert all(body["spec"].get("devices") for body in named)  # never a counters-only slice
    assert not any("partitionTypeAttribute" in body["spec"] for body in slices_to_api(plan, DRIVER, "node-a"))
    mig = plan_slices(inventory_for("dgx-h100-mig", "mig-dynamic"), "1.35")
    assert not any(
        "partitionTypeAttribute" in body["spec"]
        for body in slices_to_api(mig, DRIVER, "node-a", partition_types=True)
    )
