"""Taints for unhealthy GPUs: on their devices only, within the API's limits, valid in published
slices for Kubernetes 1.34 to 1.37, and gone without a trace once the GPU recovers."""

import re
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Taint
from dra_driver.devices.slices import MAX_TAINTS_PER_DEVICE, SliceLayout, plan_slices, slices_to_api
from dra_driver.hardware.events import GpuLost, XidEvent
from dra_driver.health.taints import lost_taint_key, tainted_inventory, xid_taint_key
from dra_driver.health.tracker import HealthState, apply, settle
from dra_driver.health.xid import DEFAULT_XID_POLICY, XidClass
from tests.support.nodes import all_profiles, inventory_for, mode_configs, simulated_node
from tests.support.slice_rules import pool_problems

DRIVER = "gpu.dra-driver.dev"
RECOVERY = 600.0
LAYOUTS: list[SliceLayout] = ["1.34", "1.35"]
VERSIONS: dict[SliceLayout, list[str]] = {"1.34": ["1.34.0"], "1.35": ["1.35.0", "1.36.0"]}
# One XID of each class, then many more unknown (degraded) ones: more than any device may carry.
MANY_XIDS = [13, 63, 94, 92, 48, 95, *range(1000, 1020)]


def gpu_uuids(inventory: Inventory) -> list[str]:
    return sorted({gpu.uuid for gpu in inventory.gpu_of_device.values()})


def faulty(events: list[XidEvent | GpuLost]) -> HealthState:
    state = HealthState(started_at=0.0)
    for event in events:
        state = apply(state, event, DEFAULT_XID_POLICY)
    return state


def taints_of(inventory: Inventory, name: str) -> list[tuple[str, str, str]]:
    return [(taint.key, taint.value, taint.effect) for taint in inventory.device_by_name[name].taints]


# The API server's rules for device taints (CONTRACTS.md §4), written out independently.
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
EFFECTS: dict[SliceLayout, set[str]] = {
    "1.34": {"NoSchedule", "NoExecute"},
    "1.35": {"None", "NoSchedule", "NoExecute"},
}


def label_key_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if len(name) > 63 or not LABEL_NAME.fullmatch(name):
        return f"{key!r}: name part is not a label name"
    if slash and (len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{key!r}: prefix is not a DNS subdomain"
    return None


def taint_problems(resource_slice: dict[str, Any], layout: SliceLayout) -> list[str]:
    problems = []
    for device in resource_slice["spec"].get("devices", []):
        taints = device.get("taints", [])
        if len(taints) > MAX_TAINTS_PER_DEVICE[layout]:
            problems.append(f"{device['name']}: {len(taints)} taints")
        for taint in taints:
            if problem := label_key_problem(taint["key"]):
                problems.append(problem)
            value = taint.get("value", "")
            if value and (len(value) > 63 or not LABEL_NAME.fullmatch(value)):
                problems.append(f"{device['name']}: value {value!r} is not a label value")
            if taint["effect"] not in EFFECTS[layout]:
                problems.append(f"{device['name']}: effect {taint['effect']} on {layout}")
    return problems


def test_a_healthy_node_keeps_its_inventory() -> None:
    inventory = inventory_for("t4x4")
    informational_only = faulty([XidEvent(gpu_uuids(inventory)[0], 63, 1.0)])
    assert tainted_inventory(inventory, HealthState(started_at=0.0), DRIVER, "1.35") is inventory
    assert tainted_inventory(inventory, informational_only, DRIVER, "1.34") is inventory


def test_only_the_devices_of_the_faulty_gpu_are_tainted() -> None:
    inventory = inventory_for("l4x8", "vgpu-partitions")
    bad = gpu_uuids(inventory)[3]
    tainted = tainted_inventory(inventory, faulty([XidEvent(bad, 48, 1.0)]), DRIVER, "1.35")

    assert [device.name for device in tainted.devices] == [device.name for device in inventory.devices]
    assert tainted.device_by_name == {device.name: device for device in tainted.devices}
    assert tainted.gpu_of_device == inventory.gpu_of_device
    assert (tainted.counter_sets, tainted.plans, tainted.notes) == (
        inventory.counter_sets,
        inventory.plans,
        inventory.notes,
    )
    hit = [device.name for device in tainted.devices if device.taints]
    assert set(hit) == {name for name, gpu in inventory.gpu_of_device.items() if gpu.uuid == bad}
    assert len(hit) > 1
    for name in hit:
        assert taints_of(tainted, name) == [("gpu.dra-driver.dev/xid", "48", "NoExecute")]
        assert replace(tainted.device_by_name[name], taints=()) == inventory.device_by_name[name]


def test_taints_are_worst_first_with_a_lost_gpu_ahead_of_its_xids() -> None:
    inventory = inventory_for("t4x4")
    gpu = gpu_uuids(inventory)[0]
    state = faulty(
        [XidEvent(gpu, 63, 1.0), XidEvent(gpu, 92, 2.0), XidEvent(gpu, 48, 3.0), GpuLost(gpu, 4.0)]
    )
    name = next(name for name, each in inventory.gpu_of_device.items() if each.uuid == gpu)

    assert taints_of(tainted_inventory(inventory, state, DRIVER, "1.35"), name) == [
        ("gpu.dra-driver.dev/gpu-lost", "true", "NoExecute"),
        ("gpu.dra-driver.dev/xid", "48", "NoExecute"),
        ("gpu.dra-driver.dev/xid", "92", "NoSchedule"),
        ("gpu.dra-driver.dev/xid", "63", "None"),
    ]
    # Kubernetes 1.34 has no effect None: the informational taint is left out there.
    assert taints_of(tainted_inventory(inventory, state, DRIVER, "1.34"), name) == [
        ("gpu.dra-driver.dev/gpu-lost", "true", "NoExecute"),
        ("gpu.dra-driver.dev/xid", "48", "NoExecute"),
        ("gpu.dra-driver.dev/xid", "92", "NoSchedule"),
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_device_carries_at_most_the_layouts_taints_keeping_the_worst(layout: SliceLayout) -> None:
    inventory = inventory_for("t4x4")
    gpu = gpu_uuids(inventory)[0]
    state = faulty([XidEvent(gpu, xid, float(at)) for at, xid in enumerate(reversed(MANY_XIDS))])
    name = next(name for name, each in inventory.gpu_of_device.items() if each.uuid == gpu)

    taints = taints_of(tainted_inventory(inventory, state, DRIVER, layout), name)

    assert len(taints) == MAX_TAINTS_PER_DEVICE[layout] == {"1.34": 4, "1.35": 16}[layout]
    assert taints[:3] == [
        ("gpu.dra-driver.dev/xid", "48", "NoExecute"),
        ("gpu.dra-driver.dev/xid", "95", "NoExecute"),
        ("gpu.dra-driver.dev/xid", "92", "NoSchedule"),
    ]
    assert ("gpu.dra-driver.dev/xid", "13", "NoExecute") not in taints


def test_taints_a_device_already_has_come_first_and_count_against_the_limit() -> None:
    inventory = inventory_for("t4x4")
    own = (Taint("example.com/maintenance", "planned", "NoSchedule"),) * 3
    first = replace(inventory.devices[0], taints=own)
    with_own = replace(
        inventory,
        devices=(first, *inventory.devices[1:]),
        device_by_name={**inventory.device_by_name, first.name: first},
    )
    gpu = inventory.gpu_of_device[first.name].uuid

    tainted = tainted_inventory(
        with_own, faulty([XidEvent(gpu, 48, 1.0), XidEvent(gpu, 92, 1.0)]), DRIVER, "1.34"
    )

    assert tainted.device_by_name[first.name].taints == (
        *own,
        Taint("gpu.dra-driver.dev/xid", "48", "NoExecute"),
    )


def test_recovery_restores_the_original_inventory_exactly() -> None:
    inventory = inventory_for("mixed", "mig-dynamic")
    gpus = gpu_uuids(inventory)
    state = faulty([XidEvent(gpus[0], 95, 10.0), XidEvent(gpus[1], 74, 20.0)])
    assert tainted_inventory(inventory, state, DRIVER, "1.35") != inventory

    half = settle(state, 610.0, RECOVERY)
    partly = tainted_inventory(inventory, half, DRIVER, "1.35")
    assert all(
        not device.taints for device in partly.devices if partly.gpu_of_device[device.name].uuid == gpus[0]
    )

    recovered = tainted_inventory(inventory, settle(half, 620.0, RECOVERY), DRIVER, "1.35")
    assert recovered is inventory


@pytest.mark.parametrize("driver", ["", "GPU.example.com", "-gpu.example.com", "a" * 64])
def test_a_driver_name_that_makes_no_label_prefix_is_refused(driver: str) -> None:
    inventory = inventory_for("t4x4")
    with pytest.raises(ValueError, match=r"^driver name "):
        tainted_inventory(inventory, HealthState(started_at=0.0), driver, "1.35")


def test_taint_keys_are_label_names() -> None:
    longest = ".".join(["a" * 15] * 4)[:63]
    for driver in (DRIVER, "gpu.nvidia.example", longest):
        assert label_key_problem(xid_taint_key(driver)) is None
        assert label_key_problem(lost_taint_key(driver)) is None


def all_inventories() -> list[tuple[str, str]]:
    return [
        (profile, config) for profile in all_profiles() for config in mode_configs(simulated_node(profile))
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("profile", "config"), all_inventories())
def test_tainted_slices_validate_for_every_supported_kubernetes(
    profile: str, config: str, layout: SliceLayout
) -> None:
    inventory = inventory_for(profile, config)
    gpus = gpu_uuids(inventory)
    events: list[XidEvent | GpuLost] = [XidEvent(gpu, xid, 1.0) for gpu in gpus[1:] for xid in MANY_XIDS]
    state = faulty(events + [GpuLost(gpu, 2.0) for gpu in gpus[::2]])

    tainted = tainted_inventory(inventory, state, DRIVER, layout)
    slices = slices_to_api(plan_slices(tainted, layout), DRIVER, "node-a")

    assert gpus == [] or any(device.taints for device in tainted.devices)
    assert pool_problems(slices, layout) == []
    for resource_slice in slices:
        assert taint_problems(resource_slice, layout) == []
        for version in VERSIONS[layout]:
            kubernetes_validate.validate(resource_slice, version, strict=True)


def test_the_taint_checks_catch_what_the_server_refuses() -> None:
    """Guards the test above: the schema alone accepts these, the server does not."""
    device = {
        "name": "gpu-0",
        "taints": [{"key": "gpu.dra-driver.dev/xid", "value": "63", "effect": "None"}] * 5,
    }
    resource_slice = {"spec": {"devices": [device]}}
    problems = taint_problems(resource_slice, "1.34")
    assert "gpu-0: 5 taints" in problems
    assert "gpu-0: effect None on 1.34" in problems
    device["taints"] = [{"key": "Gpu.example/xid", "value": "-1", "effect": "NoSchedule"}]
    assert len(taint_problems(resource_slice, "1.35")) == 2


@st.composite
def health_states(draw: st.DrawFn, gpus: list[str]) -> HealthState:
    events: list[XidEvent | GpuLost] = []
    for gpu in draw(st.lists(st.sampled_from(gpus), unique=True)):
        events += [XidEvent(gpu, xid, 1.0) for xid in draw(st.lists(st.sampled_from(MANY_XIDS), max_size=25))]
        if draw(st.booleans()):
            events.append(GpuLost(gpu, 2.0))
    return faulty(events)


PARTITIONED = inventory_for("mixed", "vgpu-partitions")
SEVERITY = {"NoExecute": 3, "NoSchedule": 2, "None": 1}


@given(health_states(gpu_uuids(PARTITIONED)), st.sampled_from(LAYOUTS))
def test_taints_follow_the_gpus_condition_and_nothing_else(state: HealthState, layout: SliceLayout) -> None:
    tainted = tainted_inventory(PARTITIONED, state, DRIVER, layout)
    for device in tainted.devices:
        original = PARTITIONED.device_by_name[device.name]
        condition = state.condition(PARTITIONED.gpu_of_device[device.name].uuid)
        assert replace(device, taints=()) == original
        if condition.worst is None or (condition.worst is XidClass.INFORMATIONAL and layout == "1.34"):
            assert device is original
            continue
        assert 1 <= len(device.taints) <= MAX_TAINTS_PER_DEVICE[layout]
        severities = [SEVERITY[taint.effect] for taint in device.taints]
        assert severities == sorted(severities, reverse=True)
        assert severities[0] == condition.worst
