"""Benchmark: where the node agent's resident memory goes, after the prepare/unprepare benchmark.

The agent runs as in `tests/bench/prepare_latency.py` (a real `dra-driver node`, simulated
dgx-h100, against the stand-in API server as another process, kubelet's calls through the socket);
after `--rounds` prepare/unprepare rounds this reads the agent's /proc/<pid>/status (VmRSS, VmHWM,
RssAnon, RssFile, Threads) and /proc/<pid>/smaps, summed by kind of mapping: the heap and other
anonymous memory (Python's object arenas, malloc arenas of threads, thread stacks) and the files
mapped in (the interpreter, extension modules and their shared libraries), the largest named.

Then, for comparison, fresh interpreters that only import what the agent imports (left out with
`--no-floors`).

The agent runs as its image runs it (`tests/bench/image_env.py`: optimised bytecode, compiled
beforehand). Each `--variant NAME:KEY=VALUE,...` runs the agent again with those environment
variables on top (for example `--variant arenas2:MALLOC_ARENA_MAX=2`, or
`--variant plain:PYTHONOPTIMIZE=0` for unoptimised bytecode); the image's way always runs first
as `default`.

Run: `python -m tests.bench.memory --rounds 500 --runs 2 --output docs/bench/memory.json`.
"""

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kubernetes import client, config

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver.tools.kubelet_client import register
from tests.bench.prepare_latency import benchmark_agent, measure
from tests.bench.standin import bench_workspace
from tests.support.claims import allocate
from tests.support.image import compile_like_the_image
from tests.support.waiting import wait_until

# The agent's simulated node, as the figures in docs/benchmarks.md were taken.
HARDWARE = "simulated:dgx-h100"
STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
LARGEST_FILES = 12

# What the bare processes import before their RSS is read.
FLOORS = {
    "interpreter": "pass",
    "asyncio": "import asyncio",
    "grpc": "import grpc, grpc.aio",
    "aiohttp": "import aiohttp",
    "pydantic": "import pydantic",
    "kubernetes (the sync package's __init__)": "import kubernetes",
    "kubernetes.aio client + config, plain": "from kubernetes.aio import client, config; client.ApiClient",
    "the agent's own client (dra_driver.kube.kube_api, server_access, kubeconfig)": (
        "import dra_driver.kube.kube_api, dra_driver.kube.server_access, dra_driver.kube.kubeconfig"
    ),
    "the official kubeconfig loader, loaded lean (exec and auth-provider users only)": (
        "import dra_driver.kube.official_loader"
    ),
    "what `dra-driver node` imports": (
        "import dra_driver.cli; dra_driver.cli.build_parser(); "
        "import dra_driver.observability.logs, dra_driver.agent.node_process"
    ),
}
FLOOR_PROBE = """
{statement}
import re
status = open("/proc/self/status").read()
print(int(re.search(r"VmRSS:\\s+(\\d+)", status)[1]))
"""


def process_status(pid: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            figures[f"{key}_mib"] = round(int(value.split()[0]) / 1024, 2)
        elif key == "Threads":
            figures["threads"] = int(value)
    return figures


def smaps_breakdown(pid: int) -> dict[str, Any]:
    """Resident MiB by mapping: anonymous memory by kind, files by name (largest first)."""
    resident: dict[str, int] = defaultdict(int)
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            path = fields[5] if len(fields) > 5 else ""
            name = Path(path).name if path.startswith("/") else (path or "[anonymous]")
        elif fields[0] == "Rss:":
            resident[name] += int(fields[1])
    anonymous = {key: value for key, value in resident.items() if key.startswith("[")}
    files = sorted(((value, key) for key, value in resident.items() if key not in anonymous), reverse=True)
    return {
        "anonymous_mib": {key: round(value / 1024, 2) for key, value in sorted(anonymous.items())},
        "files_mib_total": round(sum(value for value, _ in files) / 1024, 2),
        "largest_files_mib": {key: round(value / 1024, 2) for value, key in files[:LARGEST_FILES]},
    }


def run_agent(work: Path, kubeconfig: Path, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    api_client = config.new_client_from_config(str(kubeconfig))
    name = f"mem-{time.monotonic_ns()}"
    uid = allocate(client.ResourceV1Api(api_client), name, {"gpu": "gpu-0"}, pool="node-a")
    try:
        with benchmark_agent(work, kubeconfig, HARDWARE, env=env) as agent:
            dirs = agent.dirs
            try:
                wait_until(dirs.registration_socket.exists, timeout=30, interval=0.002)
            except AssertionError:
                print(agent.log_path.read_text()[-3000:], file=sys.stderr)
                raise
            asyncio.run(register(dirs.registration_socket))
            started = process_status(agent.process.pid)
            asyncio.run(
                measure(dirs.dra_socket, v1_pb2.Claim(namespace="default", name=name, uid=uid), rounds)
            )
            figures: dict[str, Any] = {
                "registered": started,
                "after": process_status(agent.process.pid),
                "after_smaps": smaps_breakdown(agent.process.pid),
            }
    finally:
        api_client.close()
    return figures


def import_floor(statement: str) -> float:
    probe = subprocess.run(
        [sys.executable, "-c", FLOOR_PROBE.format(statement=statement)],
        check=True,
        capture_output=True,
        text=True,
    )
    return round(int(probe.stdout) / 1024, 2)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    env = dict(assignment.split("=", 1) for assignment in assignments.split(",") if assignment)
    return name, env


def summary(name: str, figures: dict[str, Any]) -> str:
    after = figures["after"]
    anonymous = figures["after_smaps"]["anonymous_mib"]
    return (
        f"{name}: RSS {after['VmRSS_mib']:.1f} MiB (anon {after['RssAnon_mib']:.1f}, "
        f"file {after['RssFile_mib']:.1f}; heap {anonymous.get('[heap]', 0):.1f}, "
        f"other anon {anonymous.get('[anonymous]', 0):.1f}), peak {after['VmHWM_mib']:.1f}, "
        f"threads {after['threads']}; at registration {figures['registered']['VmRSS_mib']:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--runs", type=int, default=2, help="repeat every figure this many times")
    parser.add_argument("--variant", action="append", default=[], type=parse_variant)
    parser.add_argument("--no-floors", dest="floors", action="store_false")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    variants: list[tuple[str, dict[str, str]]] = [("default", {}), *args.variant]
    results: dict[str, Any] = {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "rounds": args.rounds,
        "variants": dict(variants),
        "runs": [],
    }
    compile_like_the_image()
    with bench_workspace() as (work, kubeconfig):
        for run in range(args.runs):
            run_figures: dict[str, Any] = {}
            for number, (name, env) in enumerate(variants):
                run_dir = work / f"r{run}v{number}"  # short: socket paths have a limit
                run_dir.mkdir()
                run_figures[name] = run_agent(run_dir, kubeconfig, args.rounds, env)
                print(f"run {run + 1}: {summary(name, run_figures[name])}", flush=True)
            if args.floors:
                run_figures["import_floors_mib"] = {
                    label: import_floor(statement) for label, statement in FLOORS.items()
                }
                print(f"run {run + 1}: bare imports {run_figures['import_floors_mib']}", flush=True)
            results["runs"].append(run_figures)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
