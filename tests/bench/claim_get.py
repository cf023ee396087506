"""Micro-benchmark: one claim GET, through kube_http's keep-alive pool vs the official REST layer.

Both ways run ApiServerClaimSource.get against the stand-in API server in its own process (so its
work is not counted), one GET at a time, alternating `--reps` times so that drift in the shared
machine's speed hits both alike. Figures per GET: this process's CPU time (user + system) and
wall time, the median over the repetitions, with their range. The REST-layer way is configured as
the agent configured it before (no `trust_env`).

Run: `python -m tests.bench.claim_get --reps 6 --calls 1500 --output docs/bench/claim-get.json`.
"""

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from dra_driver.claims.source import ApiServerClaimSource
from dra_driver.kube.kube_api import Configuration, KubeClient
from tests.bench.standin import standin_apiserver
from tests.support.claims import allocate

WARMUP_CALLS = 200
WAYS = ("kube_http pool", "REST layer (aiohttp)")


def claim_source(url: str, way: str) -> tuple[KubeClient, ApiServerClaimSource]:
    configuration = Configuration(host=url)
    configuration.client_session_kwargs = {"trust_env": False}
    kube = KubeClient(configuration)
    if way != WAYS[0]:
        kube.keep_alive = None  # never used: nothing to close
    return kube, ApiServerClaimSource(kube)


async def measure(url: str, reps: int, calls: int) -> dict[str, Any]:
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    wall: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(reps):
        for way in WAYS:
            kube, source = claim_source(url, way)
            try:
                for _ in range(WARMUP_CALLS):
                    await source.get("default", "bench")
                cpu_start, wall_start = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    await source.get("default", "bench")
                cpu[way].append((time.process_time() - cpu_start) / calls * 1e6)
                wall[way].append((time.perf_counter() - wall_start) / calls * 1e6)
            finally:
                await kube.close()
    return {
        way: {
            "cpu_us_median": statistics.median(cpu[way]),
            "cpu_us_range": [min(cpu[way]), max(cpu[way])],
            "wall_us_median": statistics.median(wall[way]),
            "wall_us_range": [min(wall[way]), max(wall[way])],
        }
        for way in WAYS
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=6, help="alternations of the two ways")
    parser.add_argument("--calls", type=int, default=1500, help="measured GETs per way and repetition")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        kubeconfig = Path(work) / "kubeconfig"
        with standin_apiserver(kubeconfig) as url:
            api_client = client.ApiClient(client.Configuration(host=url))
            allocate(client.ResourceV1Api(api_client), "bench", {"gpu": "gpu-0"}, pool="node-a")
            api_client.close()
            figures = asyncio.run(measure(url, args.reps, args.calls))
    results = {
        "machine": {"python": platform.python_version(), "kernel": platform.release()},
        "reps": args.reps,
        "calls": args.calls,
        "per_get": figures,
    }
    for way, figure in figures.items():
        print(
            f"{way}: CPU {figure['cpu_us_median']:.0f} us per GET "
            f"({figure['cpu_us_range'][0]:.0f}-{figure['cpu_us_range'][1]:.0f}), "
            f"wall {figure['wall_us_median']:.0f} us"
        )
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
