"""Benchmark (issue 34): would a live device order pay? Refusals and slice writes of an order the
agent republishes from the node's state (`tests.support.packing.live`), against the static
orders and the online best fit it imitates.

The issue's setting: `simulated:dgx-h100`, mode mig-dynamic (200 MIG devices, 4 device slices and
a counter slice), three seeded traces with 4,534 arrivals in all (1511, 1511, 1512; seeds 0-2) at
load 0.9, the packing bench's MIG mix (1g 45 %: small profiles most frequent). Orders: eight
random device orders, name (GPU, then placement start), binpack (ours), online best fit, and the
live order at lags 0, 1 and 5 arrivals in the layouts and modes the model has. The other trace
families of the packing bench (vGPU partitions, vGPU capacity) on the same seeds and load.

Also binpack against the online best fit and the live order on today's slices on seven more seed
triples (seeds 3-23) of the MIG and vGPU-partition families: how much of a gap is the seeds.

Run: `python -m tests.bench.live_order` (about 6 minutes on the shared build machine, so not part of
`make bench`); results in docs/bench/live-order.json.
"""

import argparse
import json
import platform
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.packing.allocator import Pool
from dra_driver.packing.best_fit import GpuScorer, ObservedState, OnlineBestFit
from dra_driver.packing.live import (
    Layout,
    LiveMode,
    LiveOrder,
    agent_groups,
    gpu_layout,
    grouped_layout,
)
from tests.bench.packing import DRIVER, MODES, inventories, node_gpus, run_order
from tests.support.packing.simulate import TraceResult, replay
from tests.support.packing.traces import Event, make_trace

ARRIVALS = (1511, 1511, 1512)
LAGS = (0, 1, 5)
SPREAD_MODES = ("mig-dynamic", "vgpu-partitions")


def shuffled(inventory: Inventory, seed: int) -> Inventory:
    devices = list(inventory.devices)
    random.Random(seed).shuffle(devices)
    return replace(inventory, devices=tuple(devices))


def best_fit(inventory: Inventory, events: Sequence[Event], memory: int) -> TraceResult:
    _, probes = agent_groups(inventory)
    scorer = GpuScorer(inventory, DRIVER, probes)
    state = ObservedState(Pool.from_inventory(inventory, DRIVER), scorer)
    return replay(state, events, memory, OnlineBestFit(scorer))


def live(
    inventory: Inventory, layout_of: Callable[[Inventory], Layout], mode: LiveMode, lag: int
) -> Callable[[Sequence[Event], int], dict[str, Any]]:
    def run(events: Sequence[Event], memory: int) -> dict[str, Any]:
        groups, probes = agent_groups(inventory)
        scorer = GpuScorer(inventory, DRIVER, probes)
        chooser = LiveOrder(inventory, scorer, groups, layout_of(inventory), mode, lag)
        result = replay(
            ObservedState(Pool.from_inventory(inventory, DRIVER), scorer), events, memory, chooser
        )
        return {
            "refused": result.refused,
            # Every admitted claim is allocated once and deallocated once in the trace.
            "changes": 2 * (result.arrivals - result.refused),
            "writes": chooser.count.writes,
            "publishes": chooser.count.publishes,
            "regenerations": chooser.count.regenerations,
            "incomplete_writes": chooser.count.incomplete_writes,
        }

    return run


def live_rows(inventory: Inventory, traces: Sequence[Sequence[Event]], memory: int) -> dict[str, Any]:
    groups, _ = agent_groups(inventory)
    variants: list[tuple[str, Callable[[Inventory], Layout], LiveMode, int]] = [
        *(
            (f"live grouped, lag {lag}", lambda inv: grouped_layout(inv, groups), "within", lag)
            for lag in LAGS
        ),
        ("live today's slices, lag 0", gpu_layout, "within", 0),
        ("live regenerating, lag 0", gpu_layout, "regenerate", 0),
    ]
    rows = {}
    for label, layout_of, mode, lag in variants:
        runs = [live(inventory, layout_of, mode, lag)(events, memory) for events in traces]
        total = {key: sum(run[key] for run in runs) for key in runs[0]}
        total["writes_per_change"] = round(total["writes"] / total["changes"], 3) if total["changes"] else 0.0
        total["slices_in_layout"] = len(layout_of(inventory).slices) + layout_of(inventory).counter_slices
        rows[label] = total
    return rows


def family(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    settings, mix_of = MODES[mode]
    gpus = node_gpus("dgx-h100", mode)
    memory = sum(gpu.memory_bytes for gpu in gpus)
    orders = inventories(gpus, settings)
    binpack = orders["binpack"]
    traces = [make_trace(mix_of(gpus[0]), memory, n, seed, args.load) for seed, n in enumerate(ARRIVALS)]
    refused: dict[str, int] = {}
    for seed in range(args.random_orders):
        refused[f"random {seed}"] = sum(run_order(shuffled(binpack, seed), t, memory).refused for t in traces)
    for name in ("name", "binpack"):
        refused[name] = sum(run_order(orders[name], t, memory).refused for t in traces)
    refused["online best fit"] = sum(best_fit(binpack, t, memory).refused for t in traces)
    return {
        "mode": mode,
        "arrivals": sum(1 for t in traces for event in t if event.shape is not None),
        "devices": len(binpack.devices),
        "static": refused,
        "live": live_rows(binpack, traces, memory),
    }


def seed_spread(mode: str, args: argparse.Namespace) -> list[dict[str, int]]:
    """Binpack, the online best fit (a perfect live order at lag 0) and the live order on today's
    slices (lag 0) on more seeds, in triples like the issue's: how much of a gap is the seeds."""
    settings, mix_of = MODES[mode]
    gpus = node_gpus("dgx-h100", mode)
    memory = sum(gpu.memory_bytes for gpu in gpus)
    binpack = inventories(gpus, settings)["binpack"]
    today = live(binpack, gpu_layout, "within", 0)
    rows = []
    for first in range(len(ARRIVALS), len(ARRIVALS) + 3 * args.spread_triples, 3):
        seeds = range(first, first + 3)
        traces = [make_trace(mix_of(gpus[0]), memory, ARRIVALS[0], seed, args.load) for seed in seeds]
        rows.append(
            {
                "first_seed": first,
                "binpack": sum(run_order(binpack, t, memory).refused for t in traces),
                "online best fit": sum(best_fit(binpack, t, memory).refused for t in traces),
                "live today's slices, lag 0": sum(today(t, memory)["refused"] for t in traces),
            }
        )
    return rows


def change(before: int, after: int) -> str:
    return f"{(after - before) / before * 100:+.1f} %" if before else "n/a"


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| mode | order | refused | vs binpack | slice writes per allocation change | "
        "generations (incomplete-pool writes) |",
        "|---|---|---|---|---|---|",
    ]
    for row in results:
        static, binpack = row["static"], row["static"]["binpack"]
        randoms = [value for key, value in static.items() if key.startswith("random")]
        if randoms:
            lines.append(
                f"| {row['mode']} | {len(randoms)} random orders | {min(randoms)}-{max(randoms)} | "
                f"{change(binpack, min(randoms))} to {change(binpack, max(randoms))} | 0 | 0 |"
            )
        for name in ("name", "binpack", "online best fit"):
            lines.append(
                f"| {row['mode']} | {name} | {static[name]} | {change(binpack, static[name])} | 0 | 0 |"
            )
        for label, live_row in row["live"].items():
            lines.append(
                f"| {row['mode']} | {label} | {live_row['refused']} | {change(binpack, live_row['refused'])} "
                f"| {live_row['writes_per_change']:.2f} | {live_row['regenerations']} "
                f"({live_row['incomplete_writes']}) |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--random-orders", type=int, default=8)
    parser.add_argument(
        "--spread-triples", type=int, default=7, help="more seed triples per mode of the seed spread"
    )
    parser.add_argument("--mode", action="append", choices=sorted(MODES), help="default: all")
    parser.add_argument("--output", type=Path, default=Path("docs/bench/live-order.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    results = [family(mode, args) for mode in args.mode or MODES]
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "settings": {key: str(value) for key, value in vars(args).items()},
        "node": "simulated:dgx-h100",
        "seeds_and_arrivals": list(enumerate(ARRIVALS)),
        "results": results,
        "table": table(results),
        "seed_spread": {mode: seed_spread(mode, args) for mode in SPREAD_MODES},
        "wall_seconds": f"{time.perf_counter() - started:.1f}",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(report["table"])
    for mode, rows in report["seed_spread"].items():
        for row in rows:
            print(mode, row)
    print(f"done in {report['wall_seconds']} s")


if __name__ == "__main__":
    main()
