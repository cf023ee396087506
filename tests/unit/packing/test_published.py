"""A live node's slices, as the API stores them, read back into the pool the agent rendered."""

from typing import Any

import pytest

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.packing.allocator import Allocation, DeviceResult, Pool
from dra_driver.packing.published import PublishedSliceError, allocations_from_claims, pool_from_slices
from tests.support.nodes import inventory_for, mode_configs, simulated_node

DRIVER = "gpu.dra-driver.dev"


def stored(inventory: Inventory, generation: int = 1, prefix: str = "") -> list[dict[str, Any]]:
    """The slices as the server keeps them: named from their generateName."""
    slices = slices_to_api(plan_slices(inventory, "1.35"), DRIVER, "node-a", generation)
    for number, body in enumerate(slices):
        body["metadata"]["name"] = f"{prefix}{body['metadata']['generateName']}{number:05d}"
    return slices


# Every kind of device: whole GPUs, static and dynamic MIG, both vGPU modes.
INVENTORIES = {
    "whole": node_inventory(simulated_node("dgx-h100"), NodeConfig()),
    "mig-dynamic": node_inventory(
        simulated_node("dgx-h100-mig"), NodeConfig(GpuSettings(mode="mig-dynamic"))
    ),
    **{f"mixed {mode}": inventory_for("mixed", mode) for mode in mode_configs(simulated_node("mixed"))},
}


@pytest.mark.parametrize("inventory", INVENTORIES.values(), ids=INVENTORIES.keys())
def test_the_slices_read_back_are_the_pool_the_agent_rendered(inventory: Inventory) -> None:
    expected = Pool.from_inventory(inventory, DRIVER)

    read = pool_from_slices(reversed(stored(inventory)), DRIVER)

    assert read.devices == expected.devices
    assert read.counter_sets == expected.counter_sets


def test_only_the_newest_generation_counts() -> None:
    old = stored(INVENTORIES["whole"], generation=1, prefix="old-")
    new = stored(INVENTORIES["mig-dynamic"], generation=2)

    read = pool_from_slices([*new, *old], DRIVER)

    assert read.devices == Pool.from_inventory(INVENTORIES["mig-dynamic"], DRIVER).devices


def test_a_quantity_with_a_fraction_names_the_slice_and_the_field() -> None:
    slices = stored(INVENTORIES["whole"])
    slices[0]["spec"]["devices"][0]["capacity"]["memory"]["value"] = "79.5Gi"

    with pytest.raises(PublishedSliceError) as raised:
        pool_from_slices(slices, DRIVER)

    assert str(raised.value) == (
        f"resourceslice {slices[0]['metadata']['name']} devices[0].capacity.memory.value: "
        "quantity '79.5Gi' is not a whole number such as 80Gi"
    )


def test_claims_count_with_their_results_on_this_node_and_driver_only() -> None:
    def claim(name: str, *results: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"namespace": "team", "name": name},
            "status": {"allocation": {"devices": {"results": list(results)}}},
        }

    share = {"request": "r", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": "1"}
    claims = [
        claim("mine", {**share, "consumedCapacity": {"memory": "10Gi", "cores": "30"}}),
        claim("other-node", {**share, "pool": "node-b"}),
        claim("other-driver", {**share, "driver": "other.example.com"}),
        {"metadata": {"namespace": "team", "name": "pending"}, "status": {}},
    ]

    held = allocations_from_claims(claims, DRIVER, "node-a")

    assert held == [
        (Allocation((DeviceResult("r", "gpu-0", {"memory": 10 * 2**30, "cores": 30}),)), "claim team/mine")
    ]
