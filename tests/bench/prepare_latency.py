"""Benchmark: NodePrepareResources / NodeUnprepareResources latency of one claim, through the socket.

Three processes, as on a node: the stand-in API server, the node agent (simulated dgx-h100), and
this client, which does what kubelet does (grpc.aio over the unix socket, v1 API). The claim's
record lives on disk (fsync'd as in production); the CDI directory is on tmpfs, like /var/run/cdi.
Each round prepares then unprepares the same claim, so every prepare does the full work: GET the
claim, check it, write the CDI spec, write and fsync the record. The floor is the same client
against a plugin that does no work (tests/bench/null_plugin.py).

Run: `make bench` (or `python -m tests.bench.prepare_latency --rounds 2000 --runs 2`).
"""

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.kubelet_client import register
from tests.support.agent import AgentDirs, start_agent
from tests.support.claims import allocate
from tests.support.waiting import wait_until

WARMUP_ROUNDS = 100


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return {
        "p50_ms": at(0.50) * 1e3,
        "p90_ms": at(0.90) * 1e3,
        "p99_ms": at(0.99) * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "n": len(ordered),
    }


async def measure(socket: Path, claim: Any, rounds: int) -> dict[str, dict[str, float]]:
    request = v1_pb2.NodePrepareResourcesRequest(claims=[claim])
    unprepare_request = v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
    prepare_times: list[float] = []
    unprepare_times: list[float] = []
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)

        async def timed(call: Callable[..., Awaitable[Any]], message: Any, into: list[float] | None) -> Any:
            start = time.perf_counter()
            response = await call(message, timeout=45)
            if into is not None:
                into.append(time.perf_counter() - start)
            return response

        for round_number in range(WARMUP_ROUNDS + rounds):
            measured = round_number >= WARMUP_ROUNDS
            answer = await timed(stub.NodePrepareResources, request, prepare_times if measured else None)
            if answer.claims[claim.uid].error:
                raise RuntimeError(f"prepare failed: {answer.claims[claim.uid].error}")
            await timed(stub.NodeUnprepareResources, unprepare_request, unprepare_times if measured else None)
    return {"prepare": percentiles(prepare_times), "unprepare": percentiles(unprepare_times)}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def run_agent_benchmark(work: Path, kubeconfig: Path, rounds: int) -> dict[str, Any]:
    api_client = config.new_client_from_config(str(kubeconfig))
    claims = client.ResourceV1Api(api_client)
    name = f"bench-{time.monotonic_ns()}"
    uid = allocate(claims, name, {"gpu": "gpu-0"}, pool="node-a")
    cdi_dir = Path(tempfile.mkdtemp(prefix="dra-bench-cdi-", dir="/dev/shm"))
    dirs = AgentDirs(root=work / "node")
    spawned = time.monotonic()
    agent = start_agent(dirs, kubeconfig, extra=("--cdi-dir", str(cdi_dir)), wait=False)
    try:
        wait_until(dirs.registration_socket.exists, timeout=30, interval=0.002)
        asyncio.run(register(dirs.registration_socket))
        registered_s = time.monotonic() - spawned
        figures: dict[str, Any] = dict(
            asyncio.run(
                measure(dirs.dra_socket, v1_pb2.Claim(namespace="default", name=name, uid=uid), rounds)
            )
        )
        figures["agent_rss_mib_after"] = rss_mib(agent.process.pid)
        figures["start_to_registered_s"] = registered_s
    finally:
        agent.terminate()
        shutil.rmtree(cdi_dir, ignore_errors=True)
        api_client.close()
    return figures


def run_floor_benchmark(work: Path, rounds: int) -> dict[str, Any]:
    socket = work / "null.sock"
    server = subprocess.Popen([sys.executable, "-m", "tests.bench.null_plugin", str(socket)])
    try:
        wait_until(socket.exists, timeout=30)
        claim = v1_pb2.Claim(namespace="default", name="floor", uid="3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17")
        return asyncio.run(measure(socket, claim, rounds))
    finally:
        server.terminate()
        server.wait(10)


def summary(agent: dict[str, Any], floor: dict[str, Any]) -> str:
    prepare, unprepare = agent["prepare"], agent["unprepare"]
    return " | ".join(
        [
            f"prepare p50 {prepare['p50_ms']:.2f} ms p99 {prepare['p99_ms']:.2f} ms",
            f"unprepare p50 {unprepare['p50_ms']:.2f} ms p99 {unprepare['p99_ms']:.2f} ms",
            f"floor prepare p50 {floor['prepare']['p50_ms']:.2f} ms",
            f"RSS {agent['agent_rss_mib_after']:.1f} MiB",
            f"start to registered {agent['start_to_registered_s']:.2f} s",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=2, help="repeat every figure this many times")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    results: dict[str, Any] = {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "rounds": args.rounds,
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as temporary:
        work = Path(temporary)
        kubeconfig = work / "kubeconfig"
        apiserver = subprocess.Popen(
            [sys.executable, "-m", "tests.support.apiserver", "--kubeconfig", str(kubeconfig)],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_until(kubeconfig.exists, timeout=30)
            for run in range(args.runs):
                run_dir = work / f"run{run}"
                run_dir.mkdir()
                floor = run_floor_benchmark(run_dir, args.rounds)
                agent = run_agent_benchmark(run_dir, kubeconfig, args.rounds)
                results["runs"].append({"floor": floor, "agent": agent})
                print(f"run {run + 1}: {summary(agent, floor)}", flush=True)
        finally:
            apiserver.terminate()
            apiserver.wait(10)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
