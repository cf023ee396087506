"""Reading the API server's version, recognising the fields it drops, and falling back to GPU modes
whose slices it stores whole."""

import copy
from collections.abc import Iterable, Sequence
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from dra_driver.devices.inventory import build_inventory
from dra_driver.devices.modes.vgpu_partitions import default_partition_sizes
from dra_driver.devices.node_config import (
    GpuEntry,
    GpuPlan,
    GpuSettings,
    Mode,
    NodeConfig,
    ResolvedMode,
    VgpuPartitionSize,
    plan_gpus,
)
from dra_driver.devices.slices import SliceLayout, plan_slices, slices_to_api
from dra_driver.hardware.model import MigMode
from dra_driver.publish.capabilities import (
    DISPLAY_ONLY_FEATURES,
    ApiFeature,
    ServerVersionError,
    describe_drops,
    dropped_fields,
    fall_back,
    features_behind,
    sends_partition_types,
    server_kubernetes_version,
    unexplained,
)
from tests.support.nodes import GIB, all_profiles, mode_configs, partition_sizes, simulated_node

DRIVER = "gpu.dra-driver.dev"
CC: ApiFeature = "DRAConsumableCapacity"
PD: ApiFeature = "DRAPartitionableDevices"
DT: ApiFeature = "DRADeviceTaints"
ALL_GATES: tuple[ApiFeature, ...] = get_args(ApiFeature)
LAYOUTS: tuple[SliceLayout, ...] = ("1.34", "1.35")


def stripped(slice_: dict[str, Any], gates: Iterable[ApiFeature]) -> dict[str, Any]:
    """The slice as an API server with these feature gates off stores it."""
    stored = copy.deepcopy(slice_)
    spec = stored["spec"]
    devices = spec.get("devices", [])
    for gate in gates:
        if gate == CC:
            for device in devices:
                device.pop("allowMultipleAllocations", None)
                for capacity in device.get("capacity", {}).values():
                    capacity.pop("requestPolicy", None)
        elif gate == PD:
            spec.pop("sharedCounters", None)
            for device in devices:
                device.pop("consumesCounters", None)
        else:
            for device in devices:
                device.pop("taints", None)
    return stored


def plans_for(profile: str, mode: str) -> tuple[GpuPlan, ...]:
    gpus = simulated_node(profile)
    return plan_gpus(mode_configs(gpus)[mode], gpus)


def published(plans: Sequence[GpuPlan], layout: SliceLayout = "1.35") -> list[dict[str, Any]]:
    return slices_to_api(plan_slices(build_inventory(plans), layout), DRIVER, "node-a")


def drops(slices: Iterable[dict[str, Any]], gates: Iterable[ApiFeature]) -> list[str]:
    gates = tuple(gates)
    return [path for slice_ in slices for path in dropped_fields(slice_, stripped(slice_, gates))]


# --- the server's version ---


@pytest.mark.parametrize(
    ("version_info", "expected"),
    [
        ({"major": "1", "minor": "36", "gitVersion": "v1.36.0"}, (1, 36)),
        ({"major": "1", "minor": "35+", "gitVersion": "v1.35.2-gke.100"}, (1, 35)),
        ({"major": "1", "gitVersion": "v1.34.1-eks-abc"}, (1, 34)),
        ({"major": "", "minor": "", "gitVersion": "v1.35.2-gke.100"}, (1, 35)),
        ({"major": "1", "minor": "thirty-five", "gitVersion": "v1.35.0+k3s1"}, (1, 35)),
    ],
)
def test_the_server_version_comes_from_major_and_minor_or_else_git_version(
    version_info: dict[str, object], expected: tuple[int, int]
) -> None:
    assert server_kubernetes_version(version_info) == expected


def test_an_unreadable_version_is_an_error_that_shows_what_the_server_sent() -> None:
    with pytest.raises(ServerVersionError) as raised:
        server_kubernetes_version({"major": "one", "minor": None, "gitVersion": "latest"})
    message = str(raised.value)
    assert "major='one'" in message
    assert "minor=None" in message
    assert "gitVersion='latest'" in message
    with pytest.raises(ServerVersionError, match="gitVersion=None"):
        server_kubernetes_version({})


def test_a_server_older_than_1_34_is_refused_because_it_has_no_resource_v1() -> None:
    with pytest.raises(
        ServerVersionError,
        match=r"serves resource\.k8s\.io/v1 only from Kubernetes 1\.34; this API server is 1\.33 ",
    ):
        server_kubernetes_version({"major": "1", "minor": "33", "gitVersion": "v1.33.4"})


# --- dropped fields ---


def test_consumable_capacity_off_drops_the_sharing_fields_of_capacity_mode_gpus() -> None:
    slices = published(plans_for("dgx-h100", "vgpu-capacity"))
    paths = drops(slices, [CC])

    assert paths == [
        f"spec.devices[gpu-{index}].{field}"
        for index in range(8)
        for field in (
            "capacity[clients].requestPolicy",
            "capacity[cores].requestPolicy",
            "capacity[memory].requestPolicy",
            "allowMultipleAllocations",
        )
    ]
    assert features_behind(paths) == {CC}
    assert unexplained(paths) == ()
    # This node's slices have no counters and no taints: other gates drop nothing.
    assert drops(slices, [PD, DT]) == []


def test_partitionable_devices_off_drops_shared_counters_and_what_dynamic_mig_consumes() -> None:
    slices = published(plans_for("dgx-h100-mig", "mig-dynamic"))
    paths = drops(slices, [PD])

    assert "spec.devices[gpu-0-mig-1g10gb-0].consumesCounters" in paths
    assert "spec.sharedCounters" in paths
    devices = sum(len(slice_["spec"].get("devices", [])) for slice_ in slices)
    assert len(paths) == devices + 1
    assert features_behind(paths) == {PD}
    assert drops(slices, [CC, DT]) == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partitionable_devices_off_drops_what_vgpu_partitions_consume_in_either_layout(
    layout: SliceLayout,
) -> None:
    slices = published(plans_for("l4x8", "vgpu-partitions"), layout)
    paths = drops(slices, [PD])

    assert "spec.devices[gpu-0].consumesCounters" in paths
    assert paths.count("spec.sharedCounters") == (8 if layout == "1.34" else 1)
    assert features_behind(paths) == {PD}
    assert drops(slices, [CC]) == []


def test_device_taints_off_drops_taints_and_devices_are_matched_by_name() -> None:
    (sent,) = published(plans_for("l4x8", "default"))
    sent["spec"]["devices"][1]["taints"] = [{"key": "example.com/xid", "value": "79", "effect": "None"}]
    stored = stripped(sent, [DT])
    stored["spec"]["devices"].reverse()

    paths = dropped_fields(sent, stored)

    assert paths == ("spec.devices[gpu-1].taints",)
    assert features_behind(paths) == {DT}


def test_with_every_gate_off_each_gate_is_named() -> None:
    gpus = simulated_node("mixed")
    config = NodeConfig(
        gpus=(
            GpuEntry("gpus[0]", 0, None, GpuSettings(mode="mig-dynamic")),
            GpuEntry("gpus[4]", 4, None, GpuSettings(mode="vgpu-capacity")),
        )
    )
    slices = published(plan_gpus(config, gpus))
    slices[0]["spec"]["devices"][0]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    paths = drops(slices, ALL_GATES)

    assert features_behind(paths) == {CC, PD, DT}
    assert unexplained(paths) == ()


def test_what_the_server_fills_in_or_re_spells_is_not_a_drop() -> None:
    (sent,) = published(plans_for("l4x8", "vgpu-capacity"))[:1]
    sent["spec"]["devices"][0]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    assert dropped_fields(sent, copy.deepcopy(sent)) == ()

    stored = copy.deepcopy(sent)
    stored["metadata"] = {"name": "00000-gpu.dra-driver.dev-node-a-x7k2p", "resourceVersion": "12"}
    device = stored["spec"]["devices"][0]
    device["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    device["capacity"]["memory"]["value"] = str(23034 * 2**20)
    device["capacity"]["memory"]["requestPolicy"]["validRange"]["min"] = "1048576"
    assert dropped_fields(sent, stored) == ()


def test_empty_values_the_server_leaves_out_are_not_drops() -> None:
    sent = {"spec": {"driver": DRIVER, "nodeName": "node-a", "devices": [], "sharedCounters": []}}
    assert dropped_fields(sent, {"spec": {"driver": DRIVER, "nodeName": "node-a"}}) == ()


def test_drops_no_gate_explains_are_reported_apart() -> None:
    (sent,) = published(plans_for("l4x8", "default"))
    stored = stripped(sent, [])
    del stored["spec"]["devices"][3]
    del stored["spec"]["devices"][0]["attributes"]["numaNode"]
    del stored["spec"]["nodeName"]

    paths = dropped_fields(sent, stored)

    assert paths == (
        "spec.nodeName",
        "spec.devices[gpu-0].attributes[numaNode]",
        "spec.devices[gpu-3]",
    )
    assert features_behind(paths) == frozenset()
    assert unexplained(paths) == paths
    # A gate drops whole fields: a missing item or a map entry named like a field is not its doing.
    odd = ("spec.devices[gpu-0].taints[0]", "spec.devices[gpu-0].capacity[requestPolicy]")
    assert features_behind(odd) == frozenset()
    assert unexplained([*odd, "spec.sharedCounters"]) == odd


def test_the_description_is_one_line_with_a_few_paths_and_the_likely_gates() -> None:
    paths = [f"spec.devices[gpu-{index}].allowMultipleAllocations" for index in range(7)]

    described = describe_drops(paths, frozenset({PD, CC}))

    assert "\n" not in described
    assert "spec.devices[gpu-4].allowMultipleAllocations and 2 more;" in described
    assert "gpu-5" not in described
    assert described.endswith("feature gates DRAConsumableCapacity, DRAPartitionableDevices are probably off")
    one = describe_drops(["spec.devices[gpu-1].taints"], frozenset({DT}))
    assert one.endswith(": spec.devices[gpu-1].taints; feature gate DRADeviceTaints is probably off")
    assert describe_drops(["spec.nodeName"], frozenset()).endswith("no known feature gate explains this")


# --- falling back ---


def test_default_partition_sizes_are_a_half_a_quarter_and_an_eighth_in_whole_gib() -> None:
    (h100, *_) = simulated_node("dgx-h100")
    (l4, *_) = simulated_node("l4x8")
    # 81559 MiB = 79.6 GiB: 39.8, 19.9 and 9.96 GiB, rounded down.
    assert h100.memory_bytes == 81559 * 2**20
    assert default_partition_sizes(h100) == tuple(VgpuPartitionSize(n * GIB) for n in (39, 19, 9))
    # 23034 MiB = 22.5 GiB: 11.2, 5.6 and 2.8 GiB, rounded down.
    assert l4.memory_bytes == 23034 * 2**20
    assert default_partition_sizes(l4) == tuple(VgpuPartitionSize(n * GIB) for n in (11, 5, 2))
    # 3 GiB: 1.5 GiB, then 0.75 and 0.375, which round to nothing.
    assert default_partition_sizes(replace(l4, memory_bytes=3 * GIB)) == (VgpuPartitionSize(GIB),)


def test_capacity_mode_falls_back_to_default_partitions_without_consumable_capacity() -> None:
    plans = plans_for("dgx-h100", "vgpu-capacity")

    fallen, notes = fall_back(plans, frozenset({CC}))

    assert [plan.mode for plan in fallen] == ["vgpu-partitions"] * 8
    assert all(plan.settings.mode == "vgpu-partitions" for plan in fallen)
    assert fallen[0].settings.partitions == default_partition_sizes(plans[0].gpu)
    assert len(notes) == 8
    assert notes[0] == (
        f"GPU 0 ({plans[0].gpu.uuid}): offered as vgpu-partitions instead of vgpu-capacity: "
        "the API server drops consumable-capacity fields (feature gate DRAConsumableCapacity is off)"
    )


def test_configured_partition_sizes_are_kept_when_capacity_mode_falls_back() -> None:
    (plan, *_) = plans_for("l4x8", "vgpu-capacity")
    sizes = (VgpuPartitionSize(4 * GIB, cores=10),)
    plan = replace(plan, settings=replace(plan.settings, partitions=sizes))

    (fallen,), _ = fall_back([plan], frozenset({CC}))

    assert fallen.settings.partitions == sizes


def test_capacity_mode_with_neither_gate_becomes_whole_gpus_with_one_note_naming_both() -> None:
    plans = plans_for("l4x8", "vgpu-capacity")

    fallen, notes = fall_back(plans, frozenset({CC, PD}))

    assert [plan.mode for plan in fallen] == ["gpu"] * 8
    assert len(notes) == 8
    assert notes[3].startswith(f"GPU 3 ({plans[3].gpu.uuid}): offered as gpu instead of vgpu-capacity: ")
    assert notes[3].endswith(
        "consumable-capacity fields (feature gate DRAConsumableCapacity is off) and "
        "shared-counter fields (feature gate DRAPartitionableDevices is off)"
    )


@pytest.mark.parametrize(
    ("profile", "mode", "fallen_mode"),
    [("l4x8", "vgpu-partitions", "gpu"), ("dgx-h100-mig", "mig-dynamic", "mig-static")],
)
def test_modes_with_shared_counters_fall_back_without_partitionable_devices(
    profile: str, mode: str, fallen_mode: ResolvedMode
) -> None:
    plans = plans_for(profile, mode)

    fallen, notes = fall_back(plans, frozenset({PD}))

    assert [plan.mode for plan in fallen] == [fallen_mode] * 8
    assert notes[0] == (
        f"GPU 0 ({plans[0].gpu.uuid}): offered as {fallen_mode} instead of {mode}: "
        "the API server drops shared-counter fields (feature gate DRAPartitionableDevices is off)"
    )


@pytest.mark.parametrize(
    ("mode", "gates"),
    [
        ("vgpu-capacity", {PD, DT}),
        ("vgpu-partitions", {CC, DT}),
        ("mig-dynamic", {CC, DT}),
        ("default", set(ALL_GATES)),
    ],
)
def test_plans_a_missing_gate_does_not_affect_are_returned_as_they_were(
    mode: str, gates: set[ApiFeature]
) -> None:
    plans = plans_for("mixed", mode)

    fallen, notes = fall_back(plans, frozenset(gates))

    assert all(old is new for old, new in zip(plans, fallen, strict=True))
    assert notes == ()


def test_only_the_gpus_whose_mode_needs_the_gate_change() -> None:
    plans = plans_for("mixed", "vgpu-capacity")

    fallen, notes = fall_back(plans, frozenset({CC}))

    moved = [new for old, new in zip(plans, fallen, strict=True) if old is not new]
    assert [plan.gpu.index for plan in moved] == [4, 5, 6, 7]
    assert [plan.mode for plan in fallen[:4]] == ["mig-static"] * 4
    assert [note.split(":")[0] for note in notes] == [plan.gpu.label for plan in moved]


@st.composite
def node_plans(draw: st.DrawFn) -> tuple[GpuPlan, ...]:
    gpus = simulated_node(draw(st.sampled_from(all_profiles())))
    entries = []
    for gpu in gpus:
        modes: list[Mode] = (
            ["mig-static", "mig-dynamic"]
            if gpu.mig_mode is MigMode.ENABLED
            else ["gpu", "vgpu-capacity", "vgpu-partitions"]
        )
        mode = draw(st.sampled_from(modes))
        partitions = partition_sizes(gpu) if mode == "vgpu-partitions" else ()
        entries.append(
            GpuEntry(f"gpus[{gpu.index}]", gpu.index, None, GpuSettings(mode, partitions=partitions))
        )
    return plan_gpus(NodeConfig(gpus=tuple(entries)), gpus)


@settings(max_examples=50, deadline=None)
@given(
    plans=node_plans(),
    gates=st.frozensets(st.sampled_from(ALL_GATES)),
    layout=st.sampled_from(LAYOUTS),
)
def test_after_falling_back_the_server_drops_nothing(
    plans: tuple[GpuPlan, ...], gates: frozenset[ApiFeature], layout: SliceLayout
) -> None:
    fallen, notes = fall_back(plans, gates)

    assert drops(published(fallen, layout), gates) == []
    # And the fall-back is no wider than needed: it moved GPUs only where the server would drop.
    assert bool(drops(published(plans, layout), gates)) == bool(notes) == (fallen != plans)


# --- the partition-type attribute (Kubernetes 1.37 alpha) ---

PDT: ApiFeature = "DRAPartitionableDevicesType"


@pytest.mark.parametrize(
    ("version", "unsupported", "sent"),
    [
        (None, frozenset(), False),
        ((1, 34), frozenset(), False),
        ((1, 36), frozenset(), False),
        ((1, 37), frozenset(), True),
        ((1, 38), frozenset({CC}), True),
        ((1, 37), frozenset({PDT}), False),
    ],
)
def test_partition_types_are_sent_to_1_37_and_later_until_the_server_drops_them(
    version: tuple[int, int] | None, unsupported: frozenset[ApiFeature], sent: bool
) -> None:
    assert sends_partition_types(version, unsupported) == sent


def test_a_dropped_partition_type_attribute_is_explained_by_its_gate_alone() -> None:
    sent = slices_to_api(
        plan_slices(build_inventory(plans_for("dgx-h100", "vgpu-partitions")), "1.35"),
        DRIVER,
        "node-a",
        partition_types=True,
    )
    stored = copy.deepcopy(sent)
    for slice_ in stored:
        slice_["spec"].pop("partitionTypeAttribute", None)

    paths = [path for pair in zip(sent, stored, strict=True) for path in dropped_fields(*pair)]

    assert paths and set(paths) == {"spec.partitionTypeAttribute"}
    assert features_behind(paths) == {PDT} <= DISPLAY_ONLY_FEATURES
    assert unexplained(paths) == ()
