"""Benchmark: `dra-driver plan` on a 16-GPU node with 10,000 pod shapes (issue 25: under 10 s).

The node is 16 H100 80GB (the most GPUs a simulated node has); the pods are 10,000 single-pod
items drawn with a fixed seed from a mix of MIG profiles, vGPU shares and whole GPUs, so every
mode places some and refuses most. Timed: parsing `--pods`, rendering each mode's devices with
the agent's code and placing every pod with the allocator model, for all four modes (what
`plan -o json` does before it prints), in this process: best and median wall time, and the best CPU time.

Run: `python -m tests.bench.plan_speed --runs 3` (add `--output FILE` for JSON).
"""

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from dra_driver.hardware.simulated_nodes import parse_node_spec, simulated_gpus
from dra_driver.packing.planner import plan_node_modes
from dra_driver.packing.shapes import parse_pods

NODE = {"gpus": [{"model": "H100-SXM5-80GB", "count": 16}]}
# Inference-heavy: many small MIG slices and vGPU shares, some larger slices, a few whole GPUs.
MIX = (
    ["1g.10gb"] * 4
    + ["2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    + ["vgpu:5Gi/10%", "vgpu:10Gi/20%", "vgpu:20Gi"] * 2
    + ["gpu"]
)


def pods_text(count: int, seed: int, mix: list[str]) -> str:
    chooser = random.Random(seed)
    return ",".join(chooser.choice(mix) for _ in range(count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--mix", help="comma-separated kinds to draw from instead of the default mix")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    gpus = simulated_gpus("node-a", parse_node_spec(NODE, "benchmark node"))
    text = pods_text(args.pods, args.seed, args.mix.split(",") if args.mix else MIX)
    samples, cpu = [], []
    for _ in range(args.runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        plans = plan_node_modes(gpus, parse_pods(text), "gpu.dra-driver.dev")
        samples.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    result = {
        "gpus": len(gpus),
        "pods": args.pods,
        "modes": {plan.mode: {"fit": plan.placed, "strandedBytes": plan.stranded_bytes} for plan in plans},
        "best_seconds": round(min(samples), 3),
        "median_seconds": round(statistics.median(samples), 3),
        # On a shared machine the CPU time is the figure to compare: wall time counts waiting.
        "best_cpu_seconds": round(min(cpu), 3),
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=2))
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
