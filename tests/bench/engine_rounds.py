"""Benchmark: the claim engine's CPU per prepare-and-unprepare round in one process, warm and cold.

`make bench`'s agent spends three to five times the CPU per 1-claim round that its engine spends
in a loop of its own (issue 31, seventh to ninth rounds). The agent waits for every claim GET and
every kubelet call, and meanwhile the other processes of the benchmark run on the same two cores;
the guess was that each round then starts with cold caches. This measures that guess on the
engine alone, as the agent wires it (`tests.support.engines`: a simulated node of 16 H100s,
records unflushed as by default, JSON logs to /dev/null), with claims from memory so that no
socket is involved, in three conditions:

- warm: a round right after the one before;
- pause: the event loop waits `--pause-ms` before each round, as the agent's waits for a call
  (the CPU runs others, or idles);
- evicted: before each round the process writes one byte per 64-byte line of a `--evict-mib`
  buffer, pushing the engine's code and data out of the caches.

Only the rounds are timed (process CPU time), so the sleep and the eviction cost nothing in the
figures. One engine per batch size, warmed up first; the conditions take turns round by round.

Run: `python -m tests.bench.engine_rounds --rounds 1000 --output docs/bench/engine-rounds.json`.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.calls import RawClaim
from dra_driver.claims.engine import ClaimEngine
from dra_driver.observability.logs import configure_logging
from tests.bench.report import host, publish
from tests.support.claims import claim_body
from tests.support.engines import POOL, simulated_engine

CONDITIONS = ("warm", "pause", "evicted")
WARMUP_ROUNDS = 50


class MemoryClaims:
    """Allocated claims as the API server would answer them, one whole GPU each."""

    def __init__(self, count: int) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.raw = [self._add(f"claim-{i}", f"gpu-{i}") for i in range(count)]

    def _add(self, name: str, device: str) -> RawClaim:
        uid = str(uuid.uuid4())
        result = {"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": POOL, "device": device}
        claim = claim_body(name, ["gpu"])
        claim["metadata"] |= {"uid": uid, "generation": 1}
        claim["status"] = {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}],
        }
        self.claims[("default", name)] = claim
        return RawClaim("default", name, uid)

    async def get(self, namespace: str, name: str) -> object:
        await asyncio.sleep(0)  # a GET always gives the loop a turn
        return self.claims[(namespace, name)]


async def one_round(engine: ClaimEngine, claims: list[RawClaim]) -> None:
    outcomes = await engine.prepare(claims)
    if failed := {uid: outcome.error for uid, outcome in outcomes.items() if outcome.error}:
        raise RuntimeError(f"prepare failed: {failed}")
    if failed_unprepare := {uid: error for uid, error in (await engine.unprepare(claims)).items() if error}:
        raise RuntimeError(f"unprepare failed: {failed_unprepare}")


async def measure(batch: int, rounds: int, pause_s: float, evict_bytes: int) -> dict[str, list[float]]:
    """CPU seconds of each round, by condition, in one fresh engine on a fresh state directory.
    The conditions take turns round by round, so the machine's drift touches all three alike."""
    source = MemoryClaims(batch)
    buffer = bytearray(evict_bytes)
    line_count = len(range(0, evict_bytes, 64))
    samples: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
    with tempfile.TemporaryDirectory(prefix="engine-rounds-") as state:
        engine = simulated_engine(Path(state), source, "dgx-h100", flush=False)
        await engine.load_state()
        for _ in range(WARMUP_ROUNDS):
            await one_round(engine, source.raw)
        for n in range(rounds * len(CONDITIONS)):
            condition = CONDITIONS[n % len(CONDITIONS)]
            if condition == "evicted":
                buffer[::64] = bytes([n % 256]) * line_count
            elif condition == "pause":
                await asyncio.sleep(pause_s)  # the loop waits in epoll, as the agent's does
            started = time.process_time()
            await one_round(engine, source.raw)
            samples[condition].append(time.process_time() - started)
        engine.close()
    return samples


def summary(samples: Sequence[float], batch: int) -> dict[str, float]:
    mean = statistics.fmean(samples)
    return {
        "cpu_per_round_mean_ms": round(mean * 1e3, 3),
        "cpu_per_round_p50_ms": round(statistics.median(samples) * 1e3, 3),
        "cpu_per_claim_mean_us": round(mean / batch * 1e6, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="claims per call")
    parser.add_argument("--pause-ms", type=float, default=2.0)
    parser.add_argument("--evict-mib", type=int, default=64)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if (
        args.rounds < 1
        or args.pause_ms < 0
        or args.evict_mib < 1
        or min(args.batches) < 1
        or max(args.batches) > 16
    ):
        parser.error("--rounds and --evict-mib at least 1, --pause-ms at least 0, --batches 1..16")
    with Path(os.devnull).open("w") as devnull:
        configure_logging("json", 0, stream=devnull)
        figures: dict[str, Any] = {}
        for batch in args.batches:
            samples = asyncio.run(measure(batch, args.rounds, args.pause_ms / 1e3, args.evict_mib * 2**20))
            for condition in CONDITIONS:
                figures[f"{condition}_{batch}"] = summary(samples[condition], batch)
        for batch in args.batches:
            warm = figures[f"warm_{batch}"]["cpu_per_round_mean_ms"]
            for condition in CONDITIONS[1:]:
                figure = figures[f"{condition}_{batch}"]
                figure["times_warm"] = round(figure["cpu_per_round_mean_ms"] / warm, 2)
    publish(
        {
            "benchmark": "engine_rounds",
            **host(),
            "rounds": args.rounds,
            "pause_ms": args.pause_ms,
            "evict_mib": args.evict_mib,
            "figures": figures,
        },
        args.output,
    )


if __name__ == "__main__":
    main()
