"""What the slices should say, from plans, API capabilities and health in one pure call: the
fallback, the layout's taint rules and the slice plan's limits agree whichever of them changed
last."""

from dra_driver.devices.slices import MAX_TAINTS_PER_DEVICE, plan_slices
from dra_driver.hardware.events import XidEvent
from dra_driver.health.taints import tainted_inventory
from dra_driver.health.tracker import HealthState, apply
from dra_driver.health.xid import DEFAULT_XID_POLICY
from dra_driver.publish.desired import ApiCapabilities, desired_pool
from tests.support.nodes import inventory_for

DRIVER = "gpu.dra-driver.dev"
# An informational XID (63: effect None, which 1.34 lacks), then six that count.
XIDS = [63, 46, 48, 62, 79, 64, 74]


def faulty(gpu_uuid: str) -> HealthState:
    state = HealthState(started_at=0.0)
    for at, xid in enumerate(XIDS):
        state = apply(state, XidEvent(gpu_uuid, xid, float(at)), DEFAULT_XID_POLICY)
    return state


def test_after_a_fallback_on_1_34_a_faulty_gpu_gets_the_taints_1_34_allows() -> None:
    shared = inventory_for("t4x4", "vgpu-capacity")
    gpu = shared.plans[0].gpu.uuid
    on_134 = ApiCapabilities("1.34", frozenset({"DRAConsumableCapacity"}))

    pool = desired_pool(shared.plans, on_134, faulty(gpu), DRIVER)

    assert {plan.mode for plan in pool.offered.plans} == {"vgpu-partitions"}
    assert len(pool.notes) == len(shared.plans)
    taints = [
        device.taints
        for device in pool.published.devices
        if pool.published.gpu_of_device[device.name].uuid == gpu
    ]
    assert taints and all(len(each) == MAX_TAINTS_PER_DEVICE["1.34"] for each in taints)
    assert all(taint.effect != "None" for each in taints for taint in each)
    assert all(not device.taints for device in pool.offered.devices)


def test_the_same_inputs_give_an_equal_pool_and_no_features_dropped_means_no_notes() -> None:
    inventory = inventory_for("t4x4", "vgpu-capacity")
    capabilities = ApiCapabilities("1.35")
    state = faulty(inventory.plans[1].gpu.uuid)

    first = desired_pool(inventory.plans, capabilities, state, DRIVER)

    assert first == desired_pool(inventory.plans, capabilities, state, DRIVER)
    assert first.notes == () and first.offered.plans == inventory.plans


def test_the_slice_plan_keeps_a_device_within_the_layouts_taints_whoever_tainted_it() -> None:
    """Taints made for 1.35 (before the server's version was read) planned for a 1.34 server."""
    inventory = inventory_for("t4x4")
    gpu = inventory.plans[0].gpu.uuid
    for_135 = tainted_inventory(inventory, faulty(gpu), DRIVER, "1.35")
    assert max(len(device.taints) for device in for_135.devices) > MAX_TAINTS_PER_DEVICE["1.34"]

    planned = [device for planned in plan_slices(for_135, "1.34") for device in planned.devices]

    assert max(len(device.taints) for device in planned) == MAX_TAINTS_PER_DEVICE["1.34"]
    worst_first = next(device for device in for_135.devices if device.taints)
    kept = next(device for device in planned if device.name == worst_first.name)
    assert kept.taints == worst_first.taints[: MAX_TAINTS_PER_DEVICE["1.34"]]
