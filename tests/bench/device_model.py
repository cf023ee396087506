"""Benchmark: the device model on the largest node we simulate with dynamic MIG.

Two figures, on 8x B200 with every MIG placement published:
- inventory: the simulated backend's discovery plus the devices and counter sets built from it
  (what the agent does at start and on every hardware change);
- plan: cutting that inventory into ResourceSlices and rendering them as API objects (what the
  ResourceSlice controller does on every change).

Run: `make bench` (or `python -m tests.bench.device_model --rounds 200 --runs 2`).
"""

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import resolve_node_spec
from tests.bench.report import host, publish

PROFILE = "b200x8-mig"
DYNAMIC_MIG = NodeConfig(default=GpuSettings(mode="mig-dynamic"))


def inventory_once() -> None:
    gpus = asyncio.run(SimulatedBackend("node-a", resolve_node_spec(PROFILE)).discover())
    node_inventory(gpus, DYNAMIC_MIG)


def timed(work: Callable[[], object], rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        samples.append(time.perf_counter() - started)
    ordered = sorted(samples)
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def run(rounds: int) -> dict[str, Any]:
    gpus = asyncio.run(SimulatedBackend("node-a", resolve_node_spec(PROFILE)).discover())
    inventory = node_inventory(gpus, DYNAMIC_MIG)
    plan = plan_slices(inventory, "1.35")
    return {
        "devices": len(inventory.devices),
        "counter_sets": len(inventory.counter_sets),
        "slices": len(plan),
        "inventory": timed(inventory_once, rounds),
        "plan_and_render": timed(
            lambda: slices_to_api(plan_slices(inventory, "1.35"), "gpu.dra-driver.dev", "node-a"), rounds
        ),
        "plan_only": timed(lambda: plan_slices(inventory, "1.35"), rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    results = {
        "node": f"simulated:{PROFILE}, every GPU mig-dynamic",
        **host(),
        "rounds": args.rounds,
        "runs": [run(args.rounds) for _ in range(args.runs)],
    }
    publish(results, args.output)


if __name__ == "__main__":
    main()
