"""`plan` places pods where the allocator model puts them, on the devices the agent renders for
each mode, and calls free memory stranded only where no shape asked for fits any more.

Expected numbers come from the GPU catalog (placements per profile, memory slices) and from the
allocator model run pod by pod, never from a picture of the answer.
"""

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import Device
from dra_driver.devices.node_config import GpuEntry, GpuSettings, NodeConfig
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import MigMode
from dra_driver.packing.allocator import Claim, NodeState, Pool, Refusal, Request
from dra_driver.packing.planner import (
    PlanMode,
    mode_pool,
    modes_for,
    plan_node_config,
    plan_node_modes,
    plan_pool,
)
from dra_driver.packing.shapes import PodGroup, PodShape, ShapeError, parse_pods
from tests.support.nodes import simulated_node

DRIVER = "gpu.dra-driver.dev"
H100 = gpu_models()["H100-SXM5-80GB"]
GIB = 2**30


def test_mig_mode_fills_one_gpu_with_1g_slices_before_the_next_and_strands_the_slice_left_over() -> None:
    assert H100.mig is not None
    profile = H100.mig.profile_named("1g.10gb")
    assert profile is not None
    per_gpu = len(profile.placements)
    (plan,) = plan_node_modes(
        simulated_node("dgx-h100"), parse_pods(f"{per_gpu + 3}x1g.10gb"), DRIVER, ("mig-dynamic",)
    )

    (outcome,) = plan.groups
    assert [pod.gpu for pod in outcome.placed] == [0] * per_gpu + [1] * 3
    first = plan.gpus[0]
    slice_bytes = H100.memory_bytes // H100.mig.memory_slices
    assert first.layout.free_bytes == (H100.mig.memory_slices - per_gpu) * slice_bytes
    # The slice after the last 1g placement takes no 1g.10gb: stranded. GPU 1 still takes more.
    assert first.stranded_bytes == first.layout.free_bytes
    assert plan.gpus[1].stranded_bytes == 0


def test_whole_mode_refuses_mig_shapes_with_the_models_reason_and_places_gpus_in_order() -> None:
    (plan,) = plan_node_modes(simulated_node("dgx-h100"), parse_pods("2x1g.10gb,3xgpu"), DRIVER, ("gpu",))

    mig, whole = plan.groups
    assert mig.placed == () and mig.refused == 2
    assert mig.refusal == "request mig: 0 of the node's devices match it, 1 needed"
    assert [pod.device for pod in whole.placed] == ["gpu-0", "gpu-1", "gpu-2"]
    assert plan.used_bytes == 3 * H100.memory_bytes


def test_a_pod_of_eight_gpus_takes_all_eight_gpus_of_a_node_in_one_claim() -> None:
    (plan,) = plan_node_modes(simulated_node("dgx-h100"), parse_pods("2xgpu:8"), DRIVER, ("gpu",))

    (outcome,) = plan.groups
    (pod,) = outcome.placed
    assert pod.devices == tuple(f"gpu-{n}" for n in range(8))
    assert pod.gpus == tuple(range(8)) and (pod.device, pod.gpu) == ("gpu-0", 0)
    assert (pod.memory_bytes, pod.cores) == (8 * H100.memory_bytes, 800)
    # The second needs eight more: none is free.
    assert outcome.refused == 1
    assert outcome.refusal == "request gpu: no free device fits device 1 of 8"
    assert (plan.placed, plan.asked) == (1, 2)
    assert plan.used_bytes == plan.memory_bytes == 8 * H100.memory_bytes
    assert [gpu.layout.free_bytes for gpu in plan.gpus] == [0] * 8


def test_a_pod_of_eight_gpus_is_refused_where_fewer_than_eight_are_free() -> None:
    (plan,) = plan_node_modes(simulated_node("dgx-h100"), parse_pods("gpu,gpu:8"), DRIVER, ("gpu",))

    one, eight = plan.groups
    assert [pod.devices for pod in one.placed] == [("gpu-0",)]
    assert eight.placed == () and eight.refusal == "request gpu: no free device fits device 8 of 8"
    assert plan.used_bytes == H100.memory_bytes
    # The seven free GPUs still take a one-GPU pod: not stranded.
    assert [gpu.stranded_bytes for gpu in plan.gpus] == [0] * 8

    (four,) = plan_node_modes(simulated_node("dgx-h100")[:4], parse_pods("gpu:8"), DRIVER, ("gpu",))
    assert four.groups[0].placed == ()
    assert four.groups[0].refusal == "request gpu: 4 of the node's devices match it, 8 needed"
    # No eight-GPU pod can ever use these GPUs: all their memory is stranded.
    assert [gpu.stranded_bytes for gpu in four.gpus] == [H100.memory_bytes] * 4


def test_a_gpu_is_stranded_when_no_multi_gpu_pod_can_use_it_with_the_others_free() -> None:
    (plan,) = plan_node_modes(simulated_node("dgx-h100"), parse_pods("gpu:3,gpu:4"), DRIVER, ("gpu",))

    three, four = plan.groups
    assert [pod.gpus for pod in three.placed] == [(0, 1, 2)]
    assert [pod.gpus for pod in four.placed] == [(3, 4, 5, 6)]
    assert [pod.memory_bytes for pod in four.placed] == [4 * H100.memory_bytes]
    # GPU 7 is free, but a gpu:3 or gpu:4 pod needs more free GPUs than the one.
    assert [gpu.stranded_bytes for gpu in plan.gpus] == [0] * 7 + [H100.memory_bytes]

    (two,) = plan_node_modes(simulated_node("dgx-h100"), parse_pods("gpu:3,gpu:2"), DRIVER, ("gpu",))
    # Three GPUs are free after the 3 and the 2: another gpu:3 fits on them, nothing stranded.
    assert [gpu.stranded_bytes for gpu in two.gpus] == [0] * 8


def test_vgpu_capacity_packs_shares_by_cores_and_strands_memory_no_share_can_use() -> None:
    (plan,) = plan_node_modes(
        simulated_node("dgx-h100"), parse_pods("5xvgpu:10Gi/30%"), DRIVER, ("vgpu-capacity",)
    )

    per_gpu = 100 // 30
    (outcome,) = plan.groups
    assert [pod.gpu for pod in outcome.placed] == [0] * per_gpu + [1] * (5 - per_gpu)
    assert all(pod.memory_bytes == 10 * GIB and pod.cores == 30 for pod in outcome.placed)
    assert plan.gpus[0].stranded_bytes == H100.memory_bytes - per_gpu * 10 * GIB
    assert plan.gpus[1].stranded_bytes == 0


def test_vgpu_partitions_are_cut_to_the_shapes_asked_for() -> None:
    (plan,) = plan_node_modes(
        simulated_node("dgx-h100"), parse_pods("4xvgpu:20Gi/25%,vgpu:10Gi"), DRIVER, ("vgpu-partitions",)
    )

    twenty, ten = plan.groups
    # An 80GB H100 has a little less than 80Gi: three 20Gi partitions, not four.
    slots = min(H100.memory_bytes // (20 * GIB), 100 // 25)
    expected = [f"gpu-0-vgpu-20gi-{slot}" for slot in range(slots)] + ["gpu-1-vgpu-20gi-0"] * (4 - slots)
    assert [pod.device for pod in twenty.placed] == expected
    # GPU 0 has memory and cores left for the 10Gi partition (cores: its share of memory).
    assert [pod.device for pod in ten.placed] == ["gpu-0-vgpu-10gi-0"]


def test_each_mode_is_rendered_by_the_agents_own_device_code() -> None:

    pool, notes = mode_pool(simulated_node("dgx-h100"), "mig-dynamic", parse_pods("1g.10gb"), DRIVER)

    rendered = node_inventory(
        simulated_node("dgx-h100-mig"), NodeConfig(default=GpuSettings(mode="mig-dynamic"))
    )
    assert [d.name for d in pool.devices] == [d.name for d in rendered.devices]
    assert notes == ()


def test_gpus_without_mig_stay_whole_in_mig_mode_with_a_note() -> None:
    pool, notes = mode_pool(simulated_node("mixed"), "mig-dynamic", parse_pods("1g.10gb"), DRIVER)

    l4 = [d for d in pool.devices if d.attributes.get("productName") == "NVIDIA L4"]
    assert {d.attributes["type"] for d in l4} == {"gpu"}
    whole = [note for note in notes if "offered whole" in note]
    assert len(whole) == 2 and all("NVIDIA L4" in note for note in whole)


@pytest.mark.parametrize("mode", ["gpu", "mig-static", "mig-dynamic", "vgpu-capacity", "vgpu-partitions"])
def test_a_gpu_with_mig_instances_is_offered_as_its_instances_in_every_mode(mode: PlanMode) -> None:
    gpus = simulated_node("mixed")
    with_instances = [gpu for gpu in gpus if gpu.mig_instances]
    assert len(with_instances) == 2

    pool, notes = mode_pool(gpus, mode, parse_pods("vgpu:4Gi,gpu"), DRIVER)

    for gpu in with_instances:
        devices = [d for d in pool.devices if gpu_of(d) == gpu.uuid]
        assert sorted(str(d.attributes["uuid"]) for d in devices) == sorted(i.uuid for i in gpu.mig_instances)
        assert {d.attributes["type"] for d in devices} == {"mig"}
        if mode != "mig-static":
            assert any(gpu.label in note and "planned as they are" in note for note in notes)


def gpu_of(device: Device) -> str:
    return str(device.attributes.get("parentUUID") or device.attributes["uuid"])


def test_mig_static_offers_the_instances_that_exist_and_the_other_gpus_whole() -> None:
    gpus = simulated_node("mixed")

    pool, notes = mode_pool(gpus, "mig-static", parse_pods("gpu"), DRIVER)

    rendered = node_inventory(
        gpus,
        NodeConfig(
            gpus=tuple(
                GpuEntry(
                    f"gpus[{gpu.index}]",
                    gpu.index,
                    None,
                    GpuSettings(mode="mig-static" if gpu.mig_instances else "gpu"),
                )
                for gpu in gpus
                if gpu.mig_instances or gpu.mig_mode is not MigMode.ENABLED
            )
        ),
    )
    expected = [d.name for d in rendered.devices]
    # The GPUs in MIG mode without instances are switched off MIG, as an operator would, and offered whole.
    assert [d.name for d in pool.devices if d.name in expected] == expected
    assert sum("has no MIG instances; offered whole" in note for note in notes) == 6


def test_a_node_config_is_planned_on_the_gpus_as_they_are() -> None:
    gpus = simulated_node("mixed")
    config = NodeConfig(
        default=GpuSettings(mode="auto"),
        gpus=(GpuEntry("gpus[0]", None, None, GpuSettings(mode="vgpu-capacity"), model="L4"),),
    )

    plan = plan_node_config(gpus, parse_pods("2x3g.40gb,2xvgpu:4Gi,8xgpu"), DRIVER, config)

    rendered = node_inventory(gpus, config)
    assert plan.mode == "node-config"
    assert [layout.uuid for layout in (gpu.layout for gpu in plan.gpus)] == sorted(
        {gpu_of(d) for d in rendered.devices}, key=[g.uuid for g in gpus].index
    )
    mig, vgpu, whole = plan.groups
    assert [pod.gpu for pod in mig.placed] == [0, 1]
    assert {pod.gpu for pod in vgpu.placed} <= {6, 7} and len(vgpu.placed) == 2
    # Only the two A100s with MIG off are whole; those in MIG mode without instances offer nothing.
    assert [pod.gpu for pod in whole.placed] == [4, 5]
    assert sum("without MIG instances, so it offers nothing" in note for note in plan.notes) == 2


def test_the_modes_are_those_the_gpus_and_shapes_allow() -> None:
    vgpu = parse_pods("vgpu:1Gi")
    assert modes_for(simulated_node("l4x8"), parse_pods("gpu")) == ("gpu", "vgpu-capacity")
    assert modes_for(simulated_node("mixed"), parse_pods("gpu")) == (
        "gpu",
        "mig-static",
        "mig-dynamic",
        "vgpu-capacity",
    )
    assert modes_for(simulated_node("dgx-h100"), vgpu) == (
        "gpu",
        "mig-dynamic",
        "vgpu-capacity",
        "vgpu-partitions",
    )


def test_an_unknown_profile_names_the_profiles_the_gpus_offer() -> None:
    with pytest.raises(ShapeError) as raised:
        plan_node_modes(simulated_node("dgx-h100"), parse_pods("gpu,2x1g.11gb"), DRIVER)

    text = str(raised.value)
    assert text.startswith('--pods[1] "2x1g.11gb": MIG profile "1g.11gb" is not offered')
    assert H100.mig is not None
    assert all(profile.name in text for profile in H100.mig.profiles)


def test_a_profile_on_a_node_without_mig_says_so() -> None:
    with pytest.raises(ShapeError, match="none of them supports MIG"):
        plan_node_modes(simulated_node("l4x8"), parse_pods("1g.10gb"), DRIVER)


def wanted(shape: PodShape) -> Callable[[Device], bool]:
    """The class's selector, and for MIG the profile's, written out again."""

    def selector(device: Device) -> bool:
        kind_ok = device.attributes.get("type") == shape.kind
        return kind_ok and (shape.kind != "mig" or device.attributes.get("profile") == shape.profile)

    return selector


def one_by_one(pool: Pool, groups: Sequence[PodGroup]) -> list[list[tuple[str, ...]]]:
    """The placements of asking the allocator model for every pod in turn, with nothing cached."""
    state = NodeState(pool)
    placed: list[list[tuple[str, ...]]] = []
    for group in groups:
        shape = group.shape
        devices = []
        for _ in range(group.count):
            capacity = {"memory": shape.memory_bytes} | ({"cores": shape.cores} if shape.cores else {})
            vgpu = shape.kind == "vgpu"
            request = Request(shape.kind, wanted(shape), shape.devices, capacity if vgpu else {})
            outcome = state.allocate(Claim((request,)))
            if isinstance(outcome, Refusal):
                continue
            state.add(outcome)
            devices.append(outcome.devices)
        placed.append(devices)
    return placed


items = st.sampled_from(
    [
        "1g.10gb",
        "2x1g.10gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
        "2g.20gb",
        "gpu",
        "gpu:2",
        "2xgpu:3",
        "vgpu:10Gi/30%",
        "vgpu:30Gi",
        "3xvgpu:5Gi/10%",
    ]
)


@settings(max_examples=25, deadline=None)
@given(st.lists(items, min_size=1, max_size=12), st.sampled_from(["mig-dynamic", "vgpu-capacity", "gpu"]))
def test_the_plan_is_the_allocator_models_answer_pod_by_pod(pods: list[str], mode: str) -> None:
    """The planner skips a shape once refused (allocations only take); asking for every pod
    anyway must give the same placements."""
    gpus = simulated_node("dgx-h100")[:2]
    groups = parse_pods(",".join(pods))
    pool, _ = mode_pool(gpus, mode, groups, DRIVER)

    plan = plan_pool(pool, groups, mode)

    assert [[pod.devices for pod in outcome.placed] for outcome in plan.groups] == one_by_one(pool, groups)
