"""Benchmark: how well the scheduler's first fit packs our devices, per published order.

For each node (DGX H100, DGX A100 80GB, B200, all 8 GPUs) and offering mode (dynamic MIG,
vGPU partitions of 5/10/20 GiB, vGPU capacity with a 1 GiB step), seeded traces
(`tests.support.packing.traces`, mixes explained there) are replayed through the allocator model
(`dra_driver.packing.allocator`) with the devices in:
- name: plain name order, what was published before issue 25;
- binpack: the new default order (`dra_driver.devices.order`);
- spread: the opt-in order;
and, as references, `BestFit` (a scoring allocator, which the scheduler is not) and the same
GPU-after-GPU order with each GPU's devices shuffled (`--shuffles` seeds). The large-node bound
is the best of all of these. On 1- and 2-GPU MIG nodes the bound is exact: a packer that may
move every running claim (`bound.RepackingPacker`); no allocator without migration refuses
fewer claims.

Also: the time to replay a 16-GPU node's trace of 10,000 MIG claims (goal < 10 s), and the API
writes a usage-following order would cost (how often the best-fit ranking of the GPUs changes).

Run: `make bench` (or `python -m tests.bench.packing`); results in docs/bench/packing.json, plots
docs/bench/packing-*.svg.
"""

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.naming import counter_set_name
from dra_driver.devices.node_config import GpuSettings, NodeConfig, VgpuPartitionSize
from dra_driver.devices.order import name_ordered
from dra_driver.devices.slices import plan_slices
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.hardware.simulated_nodes import parse_node_spec, resolve_node_spec, simulated_gpus
from dra_driver.packing.allocator import Allocation, NodeState, Pool
from tests.support.packing.bound import BestFit, RepackingPacker, shuffled_within_gpus
from tests.support.packing.simulate import TraceResult, replay, replay_repacking
from tests.support.packing.traces import (
    GIB,
    PARTITION_SIZES_GIB,
    Event,
    Mix,
    capacity_mix,
    make_trace,
    mig_mix,
    partition_mix,
    trace_hours,
)

DRIVER = "gpu.example.com"
NODES = {"DGX H100": "dgx-h100", "DGX A100 80GB": "dgx-a100-80gb", "B200": "b200x8"}
MODES: dict[str, tuple[GpuSettings, Callable[[Gpu], Mix]]] = {
    "mig-dynamic": (GpuSettings(mode="mig-dynamic"), mig_mix),
    "vgpu-partitions": (
        GpuSettings(
            mode="vgpu-partitions",
            partitions=tuple(VgpuPartitionSize(size * GIB) for size in PARTITION_SIZES_GIB),
        ),
        partition_mix,
    ),
    "vgpu-capacity": (GpuSettings(mode="vgpu-capacity", memory_step=GIB), capacity_mix),
}
ORDERS = ("name", "binpack", "spread")


def node_gpus(profile: str, mode: str, count: int | None = None) -> tuple[Gpu, ...]:
    """The profile's GPUs, with MIG mode as the offering mode needs it."""
    gpus = simulated_gpus("node-a", resolve_node_spec(profile))
    mig_mode = MigMode.ENABLED if mode.startswith("mig-") else MigMode.DISABLED
    return tuple(replace(gpu, mig_mode=mig_mode) for gpu in gpus[:count])


def inventories(gpus: Sequence[Gpu], settings: GpuSettings) -> dict[str, Inventory]:
    binpack = node_inventory(gpus, NodeConfig(default=settings))
    found = {
        "name": replace(binpack, devices=name_ordered(binpack.devices)),
        "binpack": binpack,
    }
    if settings.mode != "vgpu-capacity":
        found["spread"] = node_inventory(gpus, NodeConfig(default=replace(settings, packing="spread")))
    return found


def run_order(inventory: Inventory, events: Sequence[Event], memory: int) -> TraceResult:
    return replay(NodeState(Pool.from_inventory(inventory, DRIVER)), events, memory)


def mean(results: Sequence[TraceResult], field: str) -> float:
    values = [getattr(result, field) for result in results]
    return statistics.fmean(value for value in values if value is not None) if values else 0.0


def summary(results: Sequence[TraceResult]) -> dict[str, float]:
    return {
        "refused": sum(result.refused for result in results),
        "refused_memory": round(mean(results, "refused_memory"), 4),
        "fragmented": sum(result.fragmented for result in results),
        "memory_at_first_refusal": round(mean(results, "memory_at_first_refusal"), 4),
        "stranded": round(mean(results, "stranded"), 4),
        "utilisation": round(mean(results, "utilisation"), 4),
    }


def ranking_changes_per_hour(inventory: Inventory, events: Sequence[Event], memory: int) -> float:
    """How often a best-fit order (GPUs sorted by memory in use) would have to be republished."""
    state = NodeState(Pool.from_inventory(inventory, DRIVER))
    gpus = {gpu.uuid: gpu for gpu in inventory.gpu_of_device.values()}
    chooser = BestFit(inventory)
    held: dict[int, Allocation] = {}
    changes = 0
    last: tuple[str, ...] = ()

    def used(gpu: Gpu) -> int:
        counters = state.counters_used().get(counter_set_name(gpu))
        if counters is not None:
            return counters.get("memory", 0)
        return state.consumed(f"gpu-{gpu.minor}").get("memory", 0)

    for event in events:
        if event.shape is None:
            if (allocation := held.pop(event.claim_id, None)) is not None:
                state.remove(allocation)
        else:
            answer = chooser(state, event.shape.claim)
            if isinstance(answer, Allocation):
                state.add(answer)
                held[event.claim_id] = answer
        ranking = tuple(sorted(gpus, key=lambda uuid: (-used(gpus[uuid]), gpus[uuid].minor)))
        changes += ranking != last
        last = ranking
    return changes / trace_hours(events)


def bench_node(name: str, profile: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    settings, mix_of = MODES[mode]
    gpus = node_gpus(profile, mode)
    memory = sum(gpu.memory_bytes for gpu in gpus)
    mix = mix_of(gpus[0])
    orders = inventories(gpus, settings)
    traces = [make_trace(mix, memory, args.arrivals, seed, args.load) for seed in range(args.seeds)]
    results = {
        order: [run_order(inventory, t, memory) for t in traces] for order, inventory in orders.items()
    }
    references = {
        "best-fit": [
            replay(
                NodeState(Pool.from_inventory(orders["binpack"], DRIVER)),
                t,
                memory,
                BestFit(orders["binpack"]),
            )
            for t in traces
        ]
    }
    for shuffle in range(args.shuffles):
        shuffled = shuffled_within_gpus(orders["binpack"], shuffle)
        references[f"shuffled-{shuffle}"] = [run_order(shuffled, t, memory) for t in traces]
    everything = {**results, **references}
    bound = min(sum(result.refused for result in runs) for runs in everything.values())
    rewrites = ranking_changes_per_hour(orders["binpack"], traces[0], memory)
    slices = len(plan_slices(orders["binpack"], "1.35"))
    return {
        "node": name,
        "mode": mode,
        "devices": len(orders["binpack"].devices),
        "slices": slices,
        "orders": {order: summary(runs) for order, runs in everything.items()},
        "bound_refused": bound,
        "best_fit_order_changes_per_hour": round(rewrites, 1),
        # Every change moves devices across slices and bumps the pool generation: all slices rewritten.
        "best_fit_order_writes_per_hour": round(rewrites * slices, 1),
    }


def bench_small(gpu_count: int, args: argparse.Namespace) -> dict[str, Any]:
    """Dynamic MIG on 1 or 2 H100s against the exact repacking reference."""
    settings, mix_of = MODES["mig-dynamic"]
    gpus = node_gpus("dgx-h100", "mig-dynamic", gpu_count)
    memory = sum(gpu.memory_bytes for gpu in gpus)
    orders = inventories(gpus, settings)
    traces = [
        make_trace(mix_of(gpus[0]), memory, args.small_arrivals, seed, args.load)
        for seed in range(args.small_seeds)
    ]
    found = {order: summary([run_order(inv, t, memory) for t in traces]) for order, inv in orders.items()}
    empty = NodeState(Pool.from_inventory(orders["binpack"], DRIVER))
    found["repacking"] = summary([replay_repacking(RepackingPacker(empty, False), t, memory) for t in traces])
    return {"node": f"{gpu_count}x H100", "mode": "mig-dynamic", "orders": found}


def planning_time(arrivals: int) -> dict[str, float]:
    """Replaying 10,000 MIG claims on a 16-GPU node (the planner's worst case)."""
    spec = parse_node_spec(
        {"gpus": [{"model": "H100-SXM5-80GB", "count": 16, "migMode": "enabled"}]}, "bench"
    )
    gpus = simulated_gpus("node-a", spec)
    inventory = node_inventory(gpus, NodeConfig(default=GpuSettings(mode="mig-dynamic")))
    memory = sum(gpu.memory_bytes for gpu in gpus)
    events = make_trace(mig_mix(gpus[0]), memory, arrivals, 1, 1.0)
    started = time.perf_counter()
    result = run_order(inventory, events, memory)
    return {
        "gpus": len(gpus),
        "devices": len(inventory.devices),
        "claims": arrivals,
        "seconds": round(time.perf_counter() - started, 3),
        "refused": result.refused,
    }


def change(before: float, after: float) -> str:
    return f"{(after - before) / before * 100:+.1f} %" if before else "n/a"


def table(results: Sequence[dict[str, Any]], small: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| node | mode | refused: name | binpack | spread | bound | binpack vs name | binpack vs bound "
        "| memory at 1st refusal (name → binpack) | stranded (name → binpack) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        orders = row["orders"]
        name, binpack = orders["name"], orders["binpack"]
        spread = orders.get("spread", {}).get("refused", "—")
        lines.append(
            f"| {row['node']} | {row['mode']} | {name['refused']} | {binpack['refused']} | {spread} "
            f"| {row['bound_refused']} | {change(name['refused'], binpack['refused'])} "
            f"| {change(row['bound_refused'], binpack['refused'])} "
            f"| {name['memory_at_first_refusal']:.2f} → {binpack['memory_at_first_refusal']:.2f} "
            f"| {name['stranded']:.3f} → {binpack['stranded']:.3f} |"
        )
    lines += [
        "",
        "| node | mode | refused: name | binpack | spread | repacking packer (never strands) |",
        "|---|---|---|---|---|---|",
    ]
    for row in small:
        orders = row["orders"]
        lines.append(
            f"| {row['node']} | {row['mode']} | {orders['name']['refused']} | {orders['binpack']['refused']} "
            f"| {orders['spread']['refused']} | {orders['repacking']['refused']} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], small: Sequence[dict[str, Any]], directory: Path) -> list[str]:
    try:
        import matplotlib  # noqa: PLC0415  (optional: the plot extra)

        matplotlib.use("svg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return []
    rows = [*results, *small]
    labels = [f"{row['node']}\n{row['mode']}" for row in rows]
    series = ["name", "binpack", "spread"]
    figure, axes = plt.subplots(figsize=(13, 5))
    width = 0.2
    for number, order in enumerate(series):
        values = [row["orders"].get(order, {}).get("refused", 0) for row in rows]
        axes.bar([x + number * width for x in range(len(rows))], values, width, label=order)
    bounds = [row.get("bound_refused", row["orders"].get("repacking", {}).get("refused", 0)) for row in rows]
    axes.bar([x + 3 * width for x in range(len(rows))], bounds, width, label="bound", color="grey")
    axes.set_xticks([x + 1.5 * width for x in range(len(rows))], labels, fontsize=7)
    axes.set_ylabel("claims refused (all seeds)")
    axes.set_title("Refused claims per published device order (lower is better)")
    axes.legend()
    figure.tight_layout()
    path = directory / "packing-refused.svg"
    figure.savefig(path, metadata={"Date": None})
    plt.close(figure)
    return [str(path)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrivals", type=int, default=2000, help="claims per trace on the 8-GPU nodes")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--load", type=float, default=1.0, help="offered GPU memory over the node's")
    parser.add_argument("--shuffles", type=int, default=3)
    parser.add_argument("--small-arrivals", type=int, default=300)
    parser.add_argument("--small-seeds", type=int, default=12)
    parser.add_argument("--planning-claims", type=int, default=10_000)
    parser.add_argument("--output", type=Path, default=Path("docs/bench/packing.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    results = [bench_node(name, profile, mode, args) for name, profile in NODES.items() for mode in MODES]
    small = [bench_small(count, args) for count in (1, 2)]
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "settings": {key: str(value) for key, value in vars(args).items()},
        "nodes": results,
        "small_nodes": small,
        "planning": planning_time(args.planning_claims),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report["plots"] = plot(results, small, args.output.parent)
    report["table"] = table(results, small)
    report["wall_seconds"] = f"{time.perf_counter() - started:.1f}"
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(report["table"])
    print(json.dumps(report["planning"]))
    print(f"done in {report['wall_seconds']} s")


if __name__ == "__main__":
    main()
