"""Micro-benchmark: one claim GET, through the agent's own client (kube_http) vs the official REST layer.

Both ways GET one claim and parse its JSON against the stand-in API server in its own process (so
its work is not counted), one GET at a time, alternating `--reps` times so that drift in the
shared machine's speed hits both alike: the agent's `kube.calls.json_get`, and the official
client's `RESTClientObject` (aiohttp) sending the request its generated method sends, configured
as the agent configured it when it used that layer (no `trust_env`). Figures per GET: this
process's CPU time (user + system) and wall time, the median over the repetitions, with their
range.

Run: `python -m tests.bench.claim_get --reps 6 --calls 1500 --output docs/bench/claim-get.json`.
"""

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.aio.client.configuration import Configuration
from kubernetes.aio.client.rest import RESTClientObject

from dra_driver.kube.calls import json_get
from dra_driver.kube.claim_api import CLAIM_PATH
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.server_access import ServerAccess
from tests.bench.standin import standin_apiserver
from tests.support.claims import allocate

WARMUP_CALLS = 200
WAYS = ("kube_http pool", "REST layer (aiohttp)")
CLAIM = {"namespace": "default", "name": "bench"}


def claim_getter(url: str, way: str) -> tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[None]]]:
    """A GET of the claim, parsed, and how to close what it uses."""
    if way == WAYS[0]:
        kube = KubeClient(ServerAccess(url))
        return (lambda: json_get(kube, "GET claim", CLAIM_PATH, CLAIM, 10.0)), kube.close
    configuration = Configuration(host=url)
    configuration.client_session_kwargs = {"trust_env": False}
    rest = RESTClientObject(configuration)
    claim_url = url + CLAIM_PATH.format(**CLAIM)
    headers = {"Accept": "application/json", "User-Agent": "bench"}

    async def get() -> object:
        answer = await rest.request("GET", claim_url, headers=headers, _request_timeout=10.0)
        return json.loads(await answer.response.read())

    return get, rest.close


async def measure(url: str, reps: int, calls: int) -> dict[str, Any]:
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    wall: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(reps):
        for way in WAYS:
            get, close = claim_getter(url, way)
            try:
                for _ in range(WARMUP_CALLS):
                    await get()
                cpu_start, wall_start = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    await get()
                cpu[way].append((time.process_time() - cpu_start) / calls * 1e6)
                wall[way].append((time.perf_counter() - wall_start) / calls * 1e6)
            finally:
                await close()
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
