"""Micro-benchmark: eight claim GETs through the agent's client, at once and one after another.

What an 8-claim NodePrepareResources needs from the API server before any of its claims can be
planned, with nothing else running: the stand-in API server in its own process, eight allocated
claims, and the agent's `kube.calls.json_get` on one `KubeClient` (its pool opens up to eight
connections). Figures, medians of `--calls` repetitions after 200 of warm-up, in ms: eight GETs
awaited together, eight awaited one after another, and one.

Run: `python -m tests.bench.concurrent_gets --calls 1000`.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from kubernetes import client

from dra_driver.kube.calls import json_get
from dra_driver.kube.claim_api import CLAIM_PATH
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.server_access import ServerAccess
from tests.bench.standin import standin_apiserver
from tests.support.claims import allocate

CLAIMS = 8
WARMUP_CALLS = 200


async def measure(url: str, calls: int) -> dict[str, float]:
    kube = KubeClient(ServerAccess(url))
    names = [{"namespace": "default", "name": f"get-{i}"} for i in range(CLAIMS)]

    async def one(params: dict[str, str]) -> object:
        return await json_get(kube, "GET claim", CLAIM_PATH, params, 10.0)

    async def together() -> None:
        await asyncio.gather(*(one(params) for params in names))

    async def in_turn() -> None:
        for params in names:
            await one(params)

    async def single() -> None:
        await one(names[0])

    ways: dict[str, Callable[[], Awaitable[None]]] = {
        f"{CLAIMS} at once": together,
        f"{CLAIMS} one after another": in_turn,
        "1": single,
    }
    try:
        for _ in range(WARMUP_CALLS):
            await together()
        medians = {}
        for label, way in ways.items():
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                await way()
                times.append(time.perf_counter() - start)
            medians[label] = statistics.median(times) * 1e3
        return medians
    finally:
        await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000, help="measured repetitions of each way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, standin_apiserver(Path(work) / "kubeconfig") as url:
        api_client = client.ApiClient(client.Configuration(host=url))
        for i in range(CLAIMS):
            allocate(client.ResourceV1Api(api_client), f"get-{i}", {"gpu": f"gpu-{i}"}, pool="node-a")
        api_client.close()
        for label, median in asyncio.run(measure(url, args.calls)).items():
            print(f"{label}: {median:.3f} ms")


if __name__ == "__main__":
    main()
