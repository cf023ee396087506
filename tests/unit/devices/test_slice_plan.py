"""The slice plan never breaks an API limit, whatever the node and its configuration."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.model import CounterConsumption, Device, Taint
from dra_driver.devices.naming import parse_device_name
from dra_driver.devices.node_config import GpuEntry, GpuSettings, Mode, NodeConfig, VgpuPartitionSize
from dra_driver.devices.slices import (
    PlannedSlice,
    SliceLayout,
    SlicePlanError,
    layout_for,
    plan_slices,
    slice_name_prefix,
    slices_to_api,
)
from dra_driver.hardware.model import Gpu, MigMode
from tests.support.nodes import GIB, all_profiles, mode_configs, simulated_node
from tests.support.slice_rules import pool_problems

LAYOUTS: list[SliceLayout] = ["1.34", "1.35"]


def rendered(inventory: Inventory, layout: SliceLayout) -> list[dict[str, Any]]:
    return slices_to_api(plan_slices(inventory, layout), "gpu.dra-driver.dev", "node-a")


@st.composite
def gpu_settings(draw: st.DrawFn, gpu: Gpu) -> GpuSettings:
    if gpu.mig_mode is MigMode.ENABLED:
        if draw(st.booleans()):
            return GpuSettings(mode="mig-static")
        names = sorted(profile.name for profile in gpu.mig_profiles)
        return GpuSettings(
            mode="mig-dynamic", mig_profiles=tuple(draw(st.lists(st.sampled_from(names), unique=True)))
        )
    mode: Mode = draw(st.sampled_from(["gpu", "vgpu-capacity", "vgpu-partitions"]))
    if mode != "vgpu-partitions":
        return GpuSettings(mode=mode)
    most = max(1, gpu.memory_bytes // GIB)
    sizes = draw(
        st.lists(
            st.integers(min_value=max(1, most // 8), max_value=most), min_size=1, max_size=3, unique=True
        )
    )
    return GpuSettings(mode=mode, partitions=tuple(VgpuPartitionSize(size * GIB) for size in sizes))


@st.composite
def configured_nodes(draw: st.DrawFn) -> tuple[tuple[Gpu, ...], NodeConfig]:
    gpus = simulated_node(draw(st.sampled_from(all_profiles())))
    entries = tuple(GpuEntry(f"gpus[{gpu.index}]", gpu.index, None, draw(gpu_settings(gpu))) for gpu in gpus)
    return gpus, NodeConfig(gpus=entries)


@given(node=configured_nodes(), layout=st.sampled_from(LAYOUTS))
def test_no_plan_breaks_a_limit_and_every_device_is_published_once(
    node: tuple[tuple[Gpu, ...], NodeConfig], layout: SliceLayout
) -> None:
    inventory = node_inventory(*node)
    try:
        slices = rendered(inventory, layout)
    except SlicePlanError:
        # Only 1.34 may refuse, and only when one GPU's devices cannot share one slice.
        assert layout == "1.34"
        assert any(
            sum(
                1
                for d in inventory.devices
                if d.consumes_counters and d.consumes_counters[0].counter_set == s.name
            )
            > 64
            for s in inventory.counter_sets
        )
        return
    assert pool_problems(slices, layout) == []
    for device in inventory.devices:
        parsed = parse_device_name(device.name)
        assert parsed is not None and parsed.minor == inventory.gpu_of_device[device.name].minor
    published = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert sorted(published) == sorted(device.name for device in inventory.devices)
    if layout == "1.35":
        # The slices keep the inventory's order, which is the order the scheduler tries them in.
        assert published == [device.name for device in inventory.devices]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("profile", all_profiles())
def test_every_profile_and_mode_plans_within_the_limits(profile: str, layout: SliceLayout) -> None:
    gpus = simulated_node(profile)
    for mode, config in mode_configs(gpus).items():
        slices = rendered(node_inventory(gpus, config), layout)
        assert pool_problems(slices, layout) == [], (profile, mode)


def test_dynamic_mig_on_eight_h100s_takes_four_device_slices_and_one_counter_slice() -> None:
    gpus = simulated_node("dgx-h100-mig")
    plan = plan_slices(node_inventory(gpus, mode_configs(gpus)["mig-dynamic"]), "1.35")
    devices = sum(len(planned.devices) for planned in plan)

    assert devices == 8 * sum(len(profile.placements) for profile in gpus[0].mig_profiles)
    assert [len(planned.devices) for planned in plan[:-1]] == [64] * (devices // 64) + [devices % 64]
    assert [len(planned.counter_sets) for planned in plan] == [0] * (len(plan) - 1) + [8]


def test_the_1_34_layout_gives_each_counter_set_a_slice_with_its_devices() -> None:
    gpus = simulated_node("dgx-h100-mig")
    plan = plan_slices(node_inventory(gpus, mode_configs(gpus)["mig-dynamic"]), "1.34")

    assert len(plan) == 8
    for planned in plan:
        (counter_set,) = planned.counter_sets
        assert {c.counter_set for d in planned.devices for c in d.consumes_counters} == {counter_set.name}


def _plain(count: int, prefix: str = "a") -> list[Device]:
    return [
        Device(name=f"{prefix}-{index}", type="gpu", attributes={"type": "gpu"}, capacity={})
        for index in range(count)
    ]


def _inventory(devices: list[Device]) -> Inventory:
    return Inventory(
        devices=tuple(devices),
        counter_sets=(),
        device_by_name={d.name: d for d in devices},
        origin_of_device={},
        gpu_of_device={},
        plans=(),
    )


def test_slices_hold_128_plain_devices_but_64_once_one_has_taints_or_counters() -> None:
    plain = _plain(300)
    assert [len(p.devices) for p in plan_slices(_inventory(plain), "1.35")] == [128, 128, 44]

    tainted = Device(
        name="t-0",
        type="gpu",
        attributes={"type": "gpu"},
        capacity={},
        taints=(Taint("k", "v", "NoSchedule"),),
    )
    mixed = [*_plain(100), tainted, *_plain(100, "b")]
    sizes = [len(p.devices) for p in plan_slices(_inventory(mixed), "1.35")]
    assert sizes == [100, 64, 37]


def test_an_empty_node_still_publishes_one_empty_slice_so_the_pool_exists() -> None:
    (planned,) = plan_slices(_inventory([]), "1.35")
    assert planned == PlannedSlice()
    (rendered_slice,) = slices_to_api((planned,), "gpu.dra-driver.dev", "node-a")
    assert rendered_slice["spec"]["devices"] == []


def test_a_device_that_breaks_a_limit_is_refused_with_its_name() -> None:
    crowded = Device(name="gpu-0", type="gpu", attributes={f"a{i}": i for i in range(33)}, capacity={})
    with pytest.raises(SlicePlanError, match="device gpu-0: 33 attributes and capacities; at most 32"):
        plan_slices(_inventory([crowded]), "1.35")
    greedy = Device(
        name="gpu-1",
        type="mig",
        attributes={"type": "mig"},
        capacity={},
        consumes_counters=tuple(CounterConsumption(f"s{i}", {"c": 1}) for i in range(3)),
    )
    with pytest.raises(SlicePlanError, match="device gpu-1: consumes from 3 counter sets; at most 2"):
        plan_slices(_inventory([greedy]), "1.35")


def test_layout_follows_the_server_version_and_names_keep_plan_order() -> None:
    assert layout_for((1, 34)) == "1.34"
    assert [layout_for((1, minor)) for minor in (35, 36, 37)] == ["1.35"] * 3
    prefixes = [slice_name_prefix(index, 20, "gpu.dra-driver.dev", "node-a") for index in range(20)]
    assert prefixes == sorted(prefixes)
    assert prefixes[0] == "00000-gpu.dra-driver.dev-node-a-"
