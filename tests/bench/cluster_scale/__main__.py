"""`make bench-cluster`: the cluster-scale benchmark (issue 49), from one command.

    python -m tests.bench.cluster_scale [--nodes 100] [--trace FILE ...] [--output FILE]

Brings up the real control plane and kwok (building what the cache lacks), replays each trace
(seeded ones, or files in `plan --trace` format) per fleet and order through the real scheduler
with the allocator model in lockstep, measures what our slices cost the scheduler and how
publishing behaves at scale, writes the JSON and the pictures, and takes the cluster down.
Exit 2 for a bad flag or trace file, 1 when the cluster or a run fails.
"""

import argparse
import asyncio
import functools
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from dra_driver.base.yaml_files import YamlFileError, read_yaml_file
from dra_driver.packing.trace_file import Trace, TraceError, parse_trace
from tests.bench.cluster_scale import cluster_objects, cost, harness, publish_scale
from tests.bench.cluster_scale.api import RESOURCE, Api
from tests.bench.cluster_scale.fleet import FLEETS
from tests.bench.cluster_scale.pictures import headline, write_pictures
from tests.bench.cluster_scale.utilization import run_one
from tests.bench.cluster_scale.workload import seeded_trace
from tests.cluster.control_plane import API_SERVER
from tests.cluster.versions import kubernetes_version

ORDERS = ("binpack", "spread")
# Node names carry three digits (fleet.node_name).
MAX_NODES = 999


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.cluster_scale", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=100, help="fake 8-GPU nodes of the utilisation runs")
    parser.add_argument("--seeds", type=int, default=1, help="seeded traces per run (ignored with --trace)")
    parser.add_argument(
        "--trace", type=Path, action="append", default=[], help="a trace file (plan --trace format)"
    )
    parser.add_argument(
        "--fleets",
        default=",".join(FLEETS),
        help=f"comma-separated, of {', '.join(FLEETS)} ('' skips the utilisation runs)",
    )
    parser.add_argument("--orders", default=",".join(ORDERS), help="comma-separated, of binpack, spread")
    parser.add_argument(
        "--cost-nodes", default="100,500", help="fleet sizes of the scheduler-cost runs ('' skips them)"
    )
    parser.add_argument(
        "--cost-shapes",
        default=",".join(cost.DEFAULT_SHAPES),
        help=f"comma-separated slice shapes of the scheduler-cost runs, of {', '.join(cost.SHAPE_KEYS)}",
    )
    parser.add_argument(
        "--pods-per-node", type=int, default=2, help="pods a node of the scheduler-cost bursts"
    )
    parser.add_argument(
        "--publish-nodes", type=int, default=500, help="nodes of the publishing run (0 skips it)"
    )
    parser.add_argument("--quiet-seconds", type=float, default=60.0, help="the publishing run's quiet period")
    parser.add_argument(
        "--kubernetes", default=None, help="minor version of the control plane (default newest)"
    )
    parser.add_argument("--output", type=Path, default=Path("docs/bench/cluster-utilization.json"))
    return parser


def _list(
    text: str, allowed: tuple[str, ...] | dict[str, Any], flag: str, may_be_empty: bool = False
) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    wrong = [item for item in items if item not in allowed]
    if (not items and not may_be_empty) or wrong:
        raise ValueError(f"{flag}: expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return items


def _sizes(text: str, flag: str) -> list[int]:
    try:
        sizes = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(
            f"{flag}: expected comma-separated node counts such as 100,500, got {text!r}"
        ) from None
    if any(not 1 <= size <= MAX_NODES for size in sizes):
        raise ValueError(f"{flag}: expected node counts from 1 to {MAX_NODES}, got {text!r}")
    return sizes


def _traces(args: argparse.Namespace) -> list[tuple[str, Trace]]:
    if not args.trace:
        return [seeded_trace(args.nodes * 8, seed) for seed in range(1, args.seeds + 1)]
    found = []
    for path in args.trace:
        try:
            found.append((path.name, parse_trace(read_yaml_file(path), f"--trace {path}")))
        except YamlFileError as error:
            raise ValueError(f"--trace {path}: {error}") from error
    return found


async def _run(args: argparse.Namespace, layout_root: Path, kubelet_version: str) -> dict[str, Any]:
    kubeconfig = layout_root / "kubeconfig" / "admin.kubeconfig"
    api = await Api.admin(kubeconfig)
    try:
        await cluster_objects.create_classes(api)
        await api.create(f"{RESOURCE}/deviceclasses", cost.simple_class())
        await cluster_objects.set_node_count(api, args.nodes, kubelet_version)
        rows = []
        run = 0
        for trace_name, trace in args.traces:
            for fleet in args.fleet_list:
                for order in args.order_list:
                    run += 1
                    row, _ = await run_one(api, kubeconfig, trace_name, trace, fleet, order, args.nodes, run)
                    rows.append(row)
                    # Written after every run: a long benchmark stopped midway keeps what it measured.
                    _write(args.output, {"rows": rows, "complete": False})
        cost_rows: list[dict[str, Any]] = []
        for run, nodes in enumerate(args.cost_sizes):
            await cluster_objects.set_node_count(api, nodes, kubelet_version)
            progress = functools.partial(_progress, args.output, rows, list(cost_rows))
            cost_rows += await cost.measure(
                api,
                kubeconfig,
                layout_root / "pki",
                nodes,
                args.pods_per_node,
                run,
                args.cost_shape_list,
                progress,
            )
            _write(args.output, {"rows": rows, "scheduler_cost": cost_rows, "complete": False})
        publishing = None
        if args.publish_nodes:
            await cluster_objects.set_node_count(api, args.publish_nodes, kubelet_version)
            publishing = await publish_scale.measure(
                api, kubeconfig, layout_root / "pki", API_SERVER, args.publish_nodes, args.quiet_seconds
            )
        return {"rows": rows, "scheduler_cost": cost_rows, "publishing": publishing}
    finally:
        await api.close()


def _progress(
    path: Path, rows: list[dict[str, Any]], done: list[dict[str, Any]], size_rows: list[dict[str, Any]]
) -> None:
    """Written after every cost shape: a run stopped midway keeps the shapes it measured."""
    _write(path, {"rows": rows, "scheduler_cost": done + size_rows, "complete": False})


def _write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # The slice controllers' info lines, hundreds of them a run; their warnings still show.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        args.fleet_list = _list(args.fleets, FLEETS, "--fleets", may_be_empty=True)
        args.cost_shape_list = tuple(_list(args.cost_shapes, cost.SHAPE_KEYS, "--cost-shapes"))
        args.order_list = _list(args.orders, ORDERS, "--orders")
        args.cost_sizes = _sizes(args.cost_nodes, "--cost-nodes")
        for flag, value in (("--nodes", args.nodes), ("--publish-nodes", args.publish_nodes or 1)):
            if not 1 <= value <= MAX_NODES:
                raise ValueError(f"{flag}: expected 1 to {MAX_NODES}, got {value}")
        args.traces = _traces(args)
        version = kubernetes_version(args.kubernetes)
    except (ValueError, TraceError) as error:
        print(f"cluster-scale: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        layout = harness.bring_up(version)
    except Exception as error:
        print(f"cluster-scale: the cluster did not come up: {error}", file=sys.stderr)
        return 1
    try:
        results = asyncio.run(_run(args, layout.root, version.release))
        results["footprint_mib"] = harness.rss_mib(layout)
    finally:
        harness.tear_down(layout)
    results.update(
        kubernetes=version.release,
        machine={"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        total_seconds=round(time.monotonic() - started),
    )
    results["complete"] = True
    _write(args.output, results)
    print(f"cluster-scale: results in {args.output}")
    for picture in write_pictures(results, args.output.parent):
        print(f"cluster-scale: picture {picture}")
    if results["rows"]:
        print("\n".join(headline(results["rows"])))
    for row in results["scheduler_cost"]:
        print(
            f"cluster-scale: cost at {row['nodes']} nodes, {row['shape']}: {row['pods_per_second']} pods/s, "
            f"{row['throughput_vs_simplest']} of the simplest"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
