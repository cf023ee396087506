"""The scheduler-cost shapes publish what their labels say: a node config's mig.profiles cuts the
placements a node offers, and the diagnostic bare shape keeps every device and its counters while
dropping the entries the selectors never read."""

import pytest

from dra_driver.devices import attributes as names
from tests.bench.cluster_scale import __main__ as bench
from tests.bench.cluster_scale.cost import DEFAULT_SHAPES, SHAPES, SPLIT_SHAPES, shape_nodes, simple_slices
from tests.bench.cluster_scale.fleet import FLEETS


@pytest.mark.parametrize(
    ("key", "devices"),
    [("whole", 8), ("mig", 200), ("mig-1g", 56), ("mig-4", 104), ("vgpu-partition", 56)],
)
def test_a_shape_publishes_its_devices_per_node(key: str, devices: int) -> None:
    (node,) = shape_nodes(SHAPES[key], 1)
    assert len(node.inventory.devices) == devices


def test_mig_profiles_publish_every_placement_of_the_listed_profiles_only() -> None:
    (every,) = shape_nodes(SHAPES["mig"], 1)
    (listed,) = shape_nodes(SHAPES["mig-4"], 1)
    profiles = set(SHAPES["mig-4"].mig_profiles)
    kept = [d.name for d in every.inventory.devices if d.attributes[names.PROFILE] in profiles]
    # The order within a GPU is the driver's for that set of profiles (devices.order), not a subsequence.
    assert sorted(d.name for d in listed.inventory.devices) == sorted(kept)


def test_bare_placements_keep_their_counters_and_what_the_selectors_read() -> None:
    (full,) = shape_nodes(SHAPES["mig"], 1)
    (bare,) = shape_nodes(SHAPES["mig-bare"], 1)
    assert [d.name for d in bare.inventory.devices] == [d.name for d in full.inventory.devices]
    for stripped, device in zip(bare.inventory.devices, full.inventory.devices, strict=True):
        assert set(stripped.attributes) == {names.TYPE, names.PROFILE}
        assert stripped.capacity == {}
        assert stripped.consumes_counters == device.consumes_counters
    assert bare.inventory.counter_sets == full.inventory.counter_sets


def test_the_default_shapes_are_the_shipped_modes() -> None:
    assert all(not SHAPES[key].mig_profiles and not SHAPES[key].bare for key in DEFAULT_SHAPES)


def test_an_unknown_cost_shape_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--cost-shapes", "mig,tiny"]) == 2
    assert "--cost-shapes: expected a comma-separated list of whole" in capsys.readouterr().err


def test_an_empty_fleet_list_skips_the_utilisation_runs() -> None:
    assert bench._list("", FLEETS, "--fleets", may_be_empty=True) == []
    with pytest.raises(ValueError, match="--orders"):
        bench._list("", bench.ORDERS, "--orders")


@pytest.mark.parametrize("slices", sorted(SPLIT_SHAPES.values()))
def test_the_split_diagnostic_deals_the_same_devices_over_one_pool_of_more_slices(slices: int) -> None:
    (whole,) = simple_slices("node-0")
    split = simple_slices("node-0", slices)
    assert len(split) == slices
    assert {body["spec"]["pool"]["resourceSliceCount"] for body in split} == {slices}
    assert len({body["metadata"]["name"] for body in split}) == slices
    assert all(body["spec"]["devices"] for body in split)
    names_of = [device["name"] for body in split for device in body["spec"]["devices"]]
    assert sorted(names_of) == sorted(device["name"] for device in whole["spec"]["devices"])
