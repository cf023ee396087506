"""The lockstep check of the allocator model against the scheduler's placements, the fleet's
use it reports, and the pieces the replay reads from the API."""

from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME as D
from dra_driver.packing.allocator import Allocation, DeviceResult
from dra_driver.packing.trace_file import parse_trace
from tests.bench.cluster_scale.fleet import fleet_nodes
from tests.bench.cluster_scale.metrics import Samples, quantile
from tests.bench.cluster_scale.model import FleetModel, Placement
from tests.bench.cluster_scale.needs import GIB, Need
from tests.bench.cluster_scale.replay import RunResult, allocation_of
from tests.bench.cluster_scale.utilization import sampled_series, time_weighted
from tests.bench.cluster_scale.workload import make_trace, seeded_trace

WHOLE = Need("gpu")


def _model(fleet: str = "whole", nodes: int = 2, need: Need = WHOLE) -> FleetModel:
    return FleetModel(fleet_nodes(fleet, nodes, "binpack", [need]), D)


def _first_answer(model: FleetModel, node: str, need: Need) -> Allocation:
    answer = model.states[node].allocate(need.model_claim())
    assert isinstance(answer, Allocation)
    return answer


def test_the_model_agrees_when_the_scheduler_takes_the_first_fit() -> None:
    model = _model()
    node = "kwok-gpu-001"
    model.check(0, "gpu", WHOLE.model_claim(), Placement(node, _first_answer(model, node, WHOLE)))
    assert (model.model_placed, model.model_refused, model.differences) == (1, 0, [])
    assert model.usage()["free_whole_gpus"] == 15
    assert model.usage()["free_8gpu_nodes"] == 1


def test_another_device_a_fitting_refusal_and_a_misfit_are_each_a_difference() -> None:
    model = _model(nodes=1)
    node = "kwok-gpu-000"
    first = _first_answer(model, node, WHOLE)
    last_gpu = sorted(model.devices[node])[-1]
    assert first.devices != (last_gpu,)
    model.check(
        0, "gpu", WHOLE.model_claim(), Placement(node, Allocation((DeviceResult("devices", last_gpu),)))
    )
    model.check(1, "gpu", WHOLE.model_claim(), Placement(None))
    assert [d.pod for d in model.differences] == [0, 1]
    assert model.differences[1].scheduler == "refused" and node in model.differences[1].model
    # The scheduler's placement is what the model holds from then on.
    assert model.states[node].in_use(last_gpu)
    eight = Need("gpu", count=8)
    model.check(2, "gpu:8", eight.model_claim(), Placement(node, _first_answer(_model(nodes=1), node, eight)))
    assert model.model_refused == 1 and len(model.differences) == 3


def test_usage_counts_shares_memory_and_cores_and_gives_them_back() -> None:
    share = Need("vgpu", memory_bytes=20 * GIB, cores=30)
    model = _model("vgpu-capacity", 1, share)
    node = "kwok-gpu-000"
    allocation = _first_answer(model, node, share)
    model.check(0, share.label, share.model_claim(), Placement(node, allocation))
    usage = model.usage()
    total = sum(model.gpu_memory.values())
    assert usage["memory_allocated"] == 20 * GIB / total
    assert usage["compute_allocated"] == 30 / 800
    assert usage["fragment_memory"] == (next(iter(model.gpu_memory.values())) - 20 * GIB) / total
    assert usage["free_8gpu_nodes"] == 0 and usage["free_whole_gpus"] == 7
    model.remove(node, allocation)
    assert model.usage()["memory_allocated"] == 0 and model.usage()["free_8gpu_nodes"] == 1


def test_a_claims_allocation_is_read_with_its_consumed_capacity() -> None:
    claim: dict[str, Any] = {
        "metadata": {"name": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "devices",
                            "driver": D,
                            "pool": "kwok-gpu-003",
                            "device": "gpu-2",
                            "consumedCapacity": {"memory": "10Gi", "cores": "15"},
                        }
                    ]
                }
            }
        },
    }
    assert allocation_of(claim) == (
        "kwok-gpu-003",
        Allocation((DeviceResult("devices", "gpu-2", {"memory": 10 * GIB, "cores": 15}),)),
    )


def test_seeded_traces_repeat_and_read_as_plan_traces() -> None:
    assert make_trace(64, 3) == make_trace(64, 3) != make_trace(64, 4)
    name, trace = seeded_trace(64, 3)
    assert name == "mixed-64gpus-seed3"
    assert trace == parse_trace(make_trace(64, 3), name)
    kinds = {event.shape.text for event in trace.events if event.shape is not None}
    assert {"gpu:8", "1g.10gb", "vgpu:10Gi/15%"} <= kinds
    # About load x GPUs x lifetimes / mean GPUs a pod: 1.3 x 64 x 2 / 0.58.
    assert 200 < trace.arrivals < 380


def test_time_weighted_means_and_the_sampled_series() -> None:
    result = RunResult(series=[(0.0, {"memory_allocated": 0.5}), (30.0, {"memory_allocated": 1.0})])
    assert time_weighted(result, "memory_allocated", 40.0) == (0.5 * 30 + 1.0 * 10) / 40
    result.series = [(0.0, {"memory_allocated": 0.5, "compute_allocated": 0.1})]
    points = sampled_series(result, 100.0)
    assert points[0] == [0, 0.5, 0.1] and points[-1] == [100, 0.5, 0.1] and len(points) == 201


def test_histogram_quantiles_interpolate_within_the_bucket() -> None:
    samples: Samples = {
        ("h_bucket", (("le", "0.01"),)): 50.0,
        ("h_bucket", (("le", "0.1"),)): 100.0,
        ("h_bucket", (("le", "+Inf"),)): 100.0,
    }
    assert quantile(samples, "h", 0.5) == 0.01
    assert abs((quantile(samples, "h", 0.75) or 0) - 0.055) < 1e-9
    assert quantile({}, "h", 0.5) is None
