"""Part 2 and 3 of the benchmark: each trace through the real scheduler per fleet and order, with
the allocator model in lockstep, summed up as one row per (trace, fleet, order)."""

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver.devices.order import PackingPolicy
from dra_driver.packing.trace_file import Trace
from tests.bench.cluster_scale import cluster_objects
from tests.bench.cluster_scale.api import Api
from tests.bench.cluster_scale.fleet import fleet_mode, fleet_nodes, representative_gpu
from tests.bench.cluster_scale.harness import say
from tests.bench.cluster_scale.model import FleetModel
from tests.bench.cluster_scale.needs import need_for
from tests.bench.cluster_scale.publish import DRIVER, publishing
from tests.bench.cluster_scale.replay import Replay, RunResult

USAGE_KEYS = (
    "memory_allocated",
    "compute_allocated",
    "fragment_memory",
    "free_whole_gpus",
    "free_8gpu_nodes",
)


def time_weighted(result: RunResult, key: str, until: float) -> float:
    """The mean of one usage figure over trace time [0, until]."""
    total = 0.0
    for (at, usage), (after, _) in zip(result.series, [*result.series[1:], (until, {})], strict=True):
        total += usage[key] * max(0.0, min(after, until) - min(at, until))
    return total / until if until else 0.0


SERIES_POINTS = 200


def sampled_series(result: RunResult, until: float) -> list[list[float]]:
    """[trace seconds, memory allocated, compute allocated] at SERIES_POINTS even times up to
    `until`: the state after the last event at or before each time, for the pictures."""
    points: list[list[float]] = []
    index = 0
    for step in range(SERIES_POINTS + 1):
        moment = until * step / SERIES_POINTS
        while index + 1 < len(result.series) and result.series[index + 1][0] <= moment:
            index += 1
        usage = result.series[index][1] if result.series and result.series[index][0] <= moment else None
        memory = usage["memory_allocated"] if usage else 0.0
        compute = usage["compute_allocated"] if usage else 0.0
        points.append([round(moment), round(memory, 4), round(compute, 4)])
    return points


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


async def run_one(
    api: Api,
    kubeconfig: Path,
    trace_name: str,
    trace: Trace,
    fleet: str,
    order: PackingPolicy,
    nodes: int,
    run: int,
) -> tuple[dict[str, Any], RunResult]:
    gpu = representative_gpu(fleet)
    shapes = {event.shape for event in trace.events if event.shape is not None}
    needs = {shape: need_for(shape, fleet_mode(fleet), gpu) for shape in shapes}
    fleet_of = fleet_nodes(fleet, nodes, order, list(needs.values()))
    await cluster_objects.clear_slices(api)
    async with publishing(kubeconfig, fleet_of) as publishers:
        converge = await publishers.converged()
        namespace = f"run-{run}"
        templates = await cluster_objects.make_namespace(api, namespace, needs.values())
        model = FleetModel(fleet_of, DRIVER)
        say(
            f"{trace_name} on {fleet}/{order}: {nodes} nodes published in {converge:.1f}s, "
            f"replaying {trace.arrivals} pods"
        )
        result = await Replay(api, namespace, templates, model).run(trace, needs)
        await cluster_objects.drop_namespace(api, namespace)
    last_arrival = max(event.seconds for event in trace.events if event.shape is not None)
    row: dict[str, Any] = {
        "trace": trace_name,
        "mode": fleet,
        "order": order,
        "nodes": nodes,
        "gpus": sum(len({gpu.uuid for gpu in node.inventory.gpu_of_device.values()}) for node in fleet_of),
        "arrivals": trace.arrivals,
        "placed": result.placed,
        "refused": result.refused,
        "model_placed": model.model_placed,
        "model_refused": model.model_refused,
        "differences": len(model.differences),
        "difference_examples": [[d.pod, d.need, d.scheduler, d.model] for d in model.differences[:5]],
        "decide_ms_p50": round(statistics.median(result.decide_seconds) * 1000, 1),
        "decide_ms_p99": round(_percentile(result.decide_seconds, 0.99) * 1000, 1),
        "replay_seconds": round(result.wall_seconds, 1),
        "publish_seconds": round(converge, 2),
    }
    for key in USAGE_KEYS:
        row[f"{key}_mean"] = round(time_weighted(result, key, last_arrival), 4)
    row["series"] = sampled_series(result, last_arrival)
    say(
        f"  placed {result.placed}, refused {result.refused} "
        f"(model {model.model_placed}/{model.model_refused}, {len(model.differences)} differences), "
        f"memory {row['memory_allocated_mean']:.1%}, {result.wall_seconds:.0f}s"
    )
    return row, result
