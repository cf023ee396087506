"""Benchmark: what one ResourceClaim status.devices write costs the node agent.

The write runs in the background after prepare (claims/status_writer.py), so the prepare
benchmark (prepare_latency.py) does not see it: it prepares the same claims over and over, whose
status is stored after the first round, and unprepares them within the writer's settle time. This
measures the write itself: `--claims` claims allocated on the stand-in API server (a process of
its own, as in every benchmark), each written once by the agent's writer (settle time 0) through
the official client's REST layer, one at a time. Reported per write: wall time, and the CPU time
of this process (which plays the agent), medians over `--runs` runs.

`--hot-path ROUNDS` measures instead what the writer adds to prepare itself: the claim engine in
this process (records fsync'd in a temporary directory, claims from memory), prepare then
unprepare of one claim, in blocks of ROUNDS rounds that alternate (ABBA) between an engine with the
writer (as the agent runs it: settle time 1 s, so the immediate unprepare cancels the write) and
one without, so that both see the same machine load. Reported: the median prepare and unprepare
latency of each, over all blocks.

On a loaded machine the difference drowns in noise (both orders of the same code differ by 15 %
there), so `--overhead N` measures the added work alone: N times what prepare and unprepare add
to a claim's call (submit, the task starting into its settle sleep, cancel, the task ending), in
CPU time of this process, less the same loop without the writer.

Run: `python -m tests.bench.claim_status --claims 200 --runs 3`, `--hot-path 200 --blocks 20`,
or `--overhead 20000`.
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, config

from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.claims.calls import RawClaim
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.engine import ClaimEngine
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.status_writer import ClaimStatusWriter
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.timeouts import TIMEOUTS
from dra_driver.observability.metrics import ClaimStatusMetrics
from tests.bench.standin import bench_workspace
from tests.support.claims import allocate
from tests.support.engines import simulated_engine

DRIVER = "gpu.dra-driver.dev"
NODE = "node-a"


def _entries(device: str, now: str) -> tuple[dict[str, Any], ...]:
    """An entry as the engine builds it for a whole GPU."""
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "",
        "lastTransitionTime": now,
    }
    data = {"type": "gpu", "gpuUUID": "GPU-00000000-0000-0000-0000-000000000000", "gpuIndex": 0}
    return ({"driver": DRIVER, "pool": NODE, "device": device, "conditions": [condition], "data": data},)


async def _write_all(kubeconfig: Path, claims: list[tuple[str, str, object]]) -> tuple[float, float]:
    api = await kubernetes_api_client(kubeconfig)
    metrics = ClaimStatusMetrics()
    writer = ClaimStatusWriter(ClaimApi(api, TIMEOUTS.claim_status), DRIVER, metrics, settle_seconds=0)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        for name, uid, claim in claims:
            assert isinstance(claim, dict)
            device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
            writer.submit(
                claim_ref("default", name, uid),
                ResourceClaimView.decode(claim, DRIVER),
                partial(_entries, device),
            )
            await writer.wait_idle()
        took = (time.perf_counter() - wall) / len(claims), (time.process_time() - cpu) / len(claims)
        written = metrics.writes.labels(result="written")._value.get()
        assert written == len(claims), f"{written} of {len(claims)} writes stored"
        return took
    finally:
        await api.close()


def run_once(count: int) -> tuple[float, float]:
    with bench_workspace() as (_, kubeconfig):
        api_client = config.new_client_from_config(str(kubeconfig))
        api = client.ResourceV1Api(api_client)
        claims = []
        for i in range(count):
            name = f"claim-{i}"
            uid = allocate(api, name, {"gpu": f"gpu-{i % 16}"}, pool=NODE)
            claims.append(
                (
                    name,
                    uid,
                    api_client.sanitize_for_serialization(
                        api.read_namespaced_resource_claim(name, "default")
                    ),
                )
            )
        api_client.close()
        return asyncio.run(_write_all(kubeconfig, claims))


class _MemoryClaims:
    """One allocated claim, served from memory: the API server is not what this measures."""

    def __init__(self, uid: str) -> None:
        results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]
        self.claim = {
            "metadata": {"namespace": "default", "name": "c", "uid": uid, "resourceVersion": "1"},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    async def get(self, namespace: str, name: str) -> object:
        return self.claim


async def _hot_path(root: Path, rounds: int, blocks: int) -> dict[str, dict[str, float]]:
    uid = "0b5bb2d4-2f1e-4b8f-9d33-5f2f0c6f2b61"
    source = _MemoryClaims(uid)
    raw = [RawClaim("default", "c", uid)]
    # The writer's API is never reached: every write is cancelled within its settle time.
    writer = ClaimStatusWriter(ClaimApi(None, TIMEOUTS.claim_status), DRIVER)  # type: ignore[arg-type]
    engines: dict[str, ClaimEngine] = {
        "with writer": simulated_engine(root / "with", source, claim_status=writer),
        "without": simulated_engine(root / "without", source),
    }
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in engines}
    for engine in engines.values():
        await engine.load_state()
    for block in range(blocks * 2):
        name = list(engines)[(block + block // 2) % 2]  # ABBA ABBA: neither always goes first
        engine, (prepares, unprepares) = engines[name], samples[name]
        for _ in range(rounds):
            started = time.perf_counter()
            await engine.prepare(raw)
            prepared = time.perf_counter()
            await engine.unprepare(raw)
            prepares.append(prepared - started)
            unprepares.append(time.perf_counter() - prepared)
    for engine in engines.values():
        engine.close()
    return {
        name: {
            "prepare_p50_ms": statistics.median(prepares) * 1000,
            "unprepare_p50_ms": statistics.median(unprepares) * 1000,
        }
        for name, (prepares, unprepares) in samples.items()
    }


async def _overhead(cycles: int) -> dict[str, float]:
    writer = ClaimStatusWriter(ClaimApi(None, TIMEOUTS.claim_status), DRIVER)  # type: ignore[arg-type]
    ref = claim_ref("default", "c", "0b5bb2d4-2f1e-4b8f-9d33-5f2f0c6f2b61")
    claim = ResourceClaimView.decode({"metadata": {"uid": ref.uid}}, DRIVER)

    async def cycles_of(with_writer: bool) -> float:
        started = time.process_time()
        for _ in range(cycles):
            if with_writer:
                writer.submit(ref, claim, partial(_entries, "gpu-0"))
            await asyncio.sleep(0)  # the task starts and waits out its settle time
            if with_writer:
                writer.cancel(ref.uid)
            await asyncio.sleep(0)  # the task ends
        return (time.process_time() - started) / cycles

    bare = min([await cycles_of(False) for _ in range(3)])
    written = min([await cycles_of(True) for _ in range(3)])
    return {"added_cpu_us_per_claim": (written - bare) * 1e6, "loop_alone_us": bare * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--hot-path", type=int, metavar="ROUNDS", help="measure prepare with and without")
    parser.add_argument("--blocks", type=int, default=20, help="blocks of each kind (--hot-path)")
    parser.add_argument("--overhead", type=int, metavar="N", help="CPU the writer adds per claim")
    args = parser.parse_args()
    if args.overhead:
        print(json.dumps(asyncio.run(_overhead(args.overhead))))
        return
    if args.hot_path:
        with tempfile.TemporaryDirectory(prefix="dra-bench-") as work:
            print(json.dumps(asyncio.run(_hot_path(Path(work), args.hot_path, args.blocks)), indent=2))
        return
    results = []
    for run in range(args.runs):
        wall, cpu = run_once(args.claims)
        results.append({"wall_ms": wall * 1000, "cpu_ms": cpu * 1000})
        print(
            f"run {run + 1}: per write {wall * 1000:.2f} ms wall, {cpu * 1000:.2f} ms agent CPU", flush=True
        )
    summary = {
        "claims": args.claims,
        "runs": results,
        "median_wall_ms": statistics.median(r["wall_ms"] for r in results),
        "median_cpu_ms": statistics.median(r["cpu_ms"] for r in results),
    }
    print(json.dumps(summary))
    if args.output is not None:
        args.output.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
