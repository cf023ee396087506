"""A trace replayed with the static and the live order: the counts, the moment drawn, and a case
where the live order (the issue's online best fit) refuses what the static order admits."""

import random

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.packing.trace_file import Trace, parse_trace
from dra_driver.packing.trace_plan import replay_trace, trace_groups
from tests.support.nodes import simulated_node

DRIVER = "gpu.example.com"


def _one_h100() -> Inventory:
    return node_inventory(
        simulated_node("dgx-h100-mig")[:1], NodeConfig(default=GpuSettings(mode="mig-dynamic"))
    )


def _trace(*pods: str) -> Trace:
    return parse_trace(
        {"arrivals": [{"at": n, "pod": pod, "duration": 3600} for n, pod in enumerate(pods)]}, "t"
    )


def test_best_fit_by_the_largest_profiles_can_refuse_what_binpack_admits() -> None:
    # Two 1g: binpack takes slices 5 and 4, the live order 6 and 5 (it keeps the 2g at 4 for the
    # second 1g's sake, largest profiles first, and gives up the 1g.20gb at 6). After the 3g at 0,
    # only binpack has a 1g.20gb placement left (slices 6-7).
    static, live = replay_trace(
        _one_h100(), DRIVER, _trace("1g.10gb", "1g.10gb", "3g.40gb", "1g.20gb"), "mig-dynamic"
    )
    assert (static.refused, live.refused) == (0, 1)
    assert [pod.device for pod in static.plan.groups[0].placed] == [
        "gpu-0-mig-1g10gb-5",
        "gpu-0-mig-1g10gb-4",
    ]
    assert [pod.device for pod in live.plan.groups[0].placed] == ["gpu-0-mig-1g10gb-6", "gpu-0-mig-1g10gb-5"]
    assert live.first_refusal_seconds == 3.0 and static.first_refusal_seconds is None
    # The order the agent publishes at its start already serves these claims as best fit would.
    assert static.slice_writes == live.slice_writes == 0
    # Every admission and every departure is an allocation change.
    assert (static.changes, live.changes) == (8, 6)
    assert (static.plan.order, live.plan.order) == ("static", "live")


def test_the_gpus_are_drawn_at_the_static_orders_first_refusal_for_both_orders() -> None:
    trace = parse_trace(
        {
            "arrivals": [
                {"at": 0, "pod": "7g.80gb", "duration": 10},
                {"at": 1, "pod": "1g.10gb", "duration": 100},
                {"at": 20, "pod": "1g.10gb", "duration": 100},
            ]
        },
        "t",
    )
    static, live = replay_trace(_one_h100(), DRIVER, trace, "mig-dynamic")
    assert (static.refused, static.first_refusal_seconds) == (1, 1.0)
    # Drawn at second 1: the 7g holds the GPU; later the 1g at second 20 fits in both orders.
    for replay in (static, live):
        (gpu,) = replay.plan.gpus
        assert [block.occupant.label for block in gpu.layout.blocks if block.occupant] == ["7g.80gb"]
    assert [group.group.count for group in static.plan.groups] == [1, 2]
    assert [len(group.placed) for group in live.plan.groups] == [1, 1]


def test_groups_count_arrivals_per_kind_in_order_of_first_arrival() -> None:
    groups = trace_groups(_trace("gpu", "1g.10gb", "gpu"))
    assert [(group.shape.text, group.count, group.position) for group in groups] == [
        ("gpu", 2, 0),
        ("1g.10gb", 1, 1),
    ]


def test_the_live_replay_counts_the_slice_writes_of_a_churning_trace() -> None:
    rng = random.Random(1)
    kinds = ["1g.10gb", "1g.10gb", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    arrivals = [{"at": n * 60, "pod": rng.choice(kinds), "duration": rng.randint(60, 900)} for n in range(80)]
    static, live = replay_trace(_one_h100(), DRIVER, parse_trace({"arrivals": arrivals}, "t"), "mig-dynamic")
    assert static.slice_writes == 0 and live.slice_writes > 0
    assert live.changes == 2 * (80 - live.refused)  # every admitted pod leaves within the trace
    assert static.refused != live.refused or static.plan.groups != live.plan.groups


def test_a_pod_of_eight_gpus_takes_every_gpu_in_both_orders_and_frees_them_when_it_leaves() -> None:
    inventory = node_inventory(simulated_node("dgx-h100"), NodeConfig(default=GpuSettings(mode="gpu")))
    trace = parse_trace(
        {
            "arrivals": [
                {"at": 0, "pod": "gpu:8", "duration": 10},
                {"at": 1, "pod": "gpu", "duration": 100},
                {"at": 20, "pod": "gpu", "duration": 100},
                {"at": 21, "pod": "gpu:8", "duration": 100},
                {"at": 22, "pod": "gpu:4", "duration": 100},
            ]
        },
        "t",
    )
    for replay in replay_trace(inventory, DRIVER, trace, "gpu"):
        eights, ones, fours = replay.plan.groups
        assert [pod.devices for pod in eights.placed] == [tuple(f"gpu-{n}" for n in range(8))]
        assert [pod.gpus for pod in eights.placed] == [tuple(range(8))]
        # The gpu at 1 finds none free; at 21 one GPU is taken, so the second gpu:8 is refused.
        assert [pod.devices for pod in ones.placed] == [("gpu-0",)]
        assert [pod.devices for pod in fours.placed] == [("gpu-1", "gpu-2", "gpu-3", "gpu-4")]
        assert (replay.refused, replay.first_refusal_seconds) == (2, 1.0)
        # Drawn at the first refusal (second 1): the gpu:8 holds all eight GPUs.
        assert [gpu.layout.free_bytes for gpu in replay.plan.gpus] == [0] * 8
        assert {o.label for gpu in replay.plan.gpus for o in gpu.layout.occupants} == {"gpu:8"}
