"""Kubelet's side of a DRA plugin's socket, as load for the latency benchmark.

What is sent is what kubelet sends, so the plugin under test cannot tell the difference: grpc.aio
over the plugin's unix socket, DRAPlugin v1, kubelet's 45 s deadline on every call, and one
connection per plugin (kubelet's DRA manager dials each plugin once and its pod workers share that
connection; `channel_per_caller` exists to compare). Requests are built before the clock starts
and every answer is checked after it stops (one entry per claim of the call, no error, devices for
a prepare), so the timings hold the awaited call alone, and a plugin that fails fast cannot post
fast numbers. The same code runs against the agent and against tests/bench/null_plugin.py, whose
numbers are the floor: what this client, gRPC and the socket cost by themselves.

Timings are `time.perf_counter` around the awaited call. Three shapes of load:

- `measure`: one claim per call, prepare then unprepare, one call at a time;
- `measure_calls`: the same with several claims per call (kubelet sends all of a pod's claims
  for one plugin in one call);
- `measure_concurrent`: callers that each prepare and unprepare their own claim in a loop, all at
  once (pods starting together), for a fixed time after a warm-up.
"""

import asyncio
import statistics
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc

WARMUP_ROUNDS = 100
# Kubelet's deadline for one NodePrepareResources / NodeUnprepareResources call.
KUBELET_DEADLINE_SECONDS = 45.0


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """Nearest-rank percentiles of durations in seconds, reported in milliseconds."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples: nothing completed in the measured time")

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return {
        "p50_ms": at(0.50) * 1e3,
        "p90_ms": at(0.90) * 1e3,
        "p99_ms": at(0.99) * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "n": len(ordered),
    }


class PluginRefused(RuntimeError):
    """The plugin answered, but not with success for every claim of the call."""


@dataclass(frozen=True)
class ClaimCalls:
    """The prepare and unprepare requests of a fixed set of claims, built once."""

    uids: frozenset[str]
    prepare: Any
    unprepare: Any

    @classmethod
    def of(cls, claims: Sequence[Any]) -> "ClaimCalls":
        return cls(
            uids=frozenset(claim.uid for claim in claims),
            prepare=v1_pb2.NodePrepareResourcesRequest(claims=claims),
            unprepare=v1_pb2.NodeUnprepareResourcesRequest(claims=claims),
        )


class KubeletClient:
    """DRAPlugin v1 calls over one channel, timed, with their answers checked."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = v1_grpc.DRAPluginStub(channel)

    async def prepare(self, calls: ClaimCalls) -> float:
        """Seconds the NodePrepareResources call took."""
        start = time.perf_counter()
        answer = await self._stub.NodePrepareResources(calls.prepare, timeout=KUBELET_DEADLINE_SECONDS)
        elapsed = time.perf_counter() - start
        _check_answer("prepare", answer, calls.uids)
        for uid in calls.uids:
            if not answer.claims[uid].devices:
                raise PluginRefused(f"prepare of claim {uid}: no devices in the answer")
        return elapsed

    async def unprepare(self, calls: ClaimCalls) -> float:
        """Seconds the NodeUnprepareResources call took."""
        start = time.perf_counter()
        answer = await self._stub.NodeUnprepareResources(calls.unprepare, timeout=KUBELET_DEADLINE_SECONDS)
        elapsed = time.perf_counter() - start
        _check_answer("unprepare", answer, calls.uids)
        return elapsed


def _check_answer(action: str, answer: Any, uids: frozenset[str]) -> None:
    if set(answer.claims) != uids:
        raise PluginRefused(f"{action}: answered claims {sorted(answer.claims)}, asked for {sorted(uids)}")
    for uid in uids:
        if answer.claims[uid].error:
            raise PluginRefused(f"{action} of claim {uid}: {answer.claims[uid].error}")


def _channel(socket: Path) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix://{socket}")


async def measure(
    socket: Path, claim: Any, rounds: int, warmup: int = WARMUP_ROUNDS
) -> dict[str, dict[str, float]]:
    """One claim per call: see `measure_calls`."""
    return await measure_calls(socket, [claim], rounds, warmup)


async def measure_calls(
    socket: Path, claims: Sequence[Any], rounds: int, warmup: int = WARMUP_ROUNDS
) -> dict[str, dict[str, float]]:
    """`rounds` of one NodePrepareResources of all `claims` in the one call, followed by one
    NodeUnprepareResources of the same, after `warmup` unmeasured rounds. Every round unprepares,
    so every prepare does the whole work again."""
    calls = ClaimCalls.of(claims)
    prepare_times: list[float] = []
    unprepare_times: list[float] = []
    async with _channel(socket) as channel:
        client = KubeletClient(channel)
        for _ in range(warmup):
            await client.prepare(calls)
            await client.unprepare(calls)
        for _ in range(rounds):
            prepare_times.append(await client.prepare(calls))
            unprepare_times.append(await client.unprepare(calls))
    return {"prepare": percentiles(prepare_times), "unprepare": percentiles(unprepare_times)}


@dataclass
class _CallerTimes:
    prepare: list[float] = field(default_factory=list)
    unprepare: list[float] = field(default_factory=list)
    pairs_done_at: list[float] = field(default_factory=list)
    pairs_total: int = 0


async def _caller(
    client: KubeletClient, calls: ClaimCalls, measure_from: float, until: float
) -> _CallerTimes:
    """Prepares and unprepares one claim back to back until `until`. Calls that start in the
    measured window are timed; a pair counts towards throughput when it ends inside it."""
    times = _CallerTimes()
    while (start := time.perf_counter()) < until:
        prepared = await client.prepare(calls)
        unprepared = await client.unprepare(calls)
        end = time.perf_counter()
        times.pairs_total += 1
        if start >= measure_from:
            times.prepare.append(prepared)
            times.unprepare.append(unprepared)
        if measure_from <= end <= until:
            times.pairs_done_at.append(end)
    return times


async def measure_concurrent(
    socket: Path,
    claims: Sequence[Any],
    duration_s: float,
    warmup_s: float,
    channel_per_caller: bool = False,
) -> dict[str, Any]:
    """One caller per claim, all at once, each preparing and unpreparing its own claim in a loop:
    `warmup_s` unmeasured, then `duration_s` measured. Throughput is completed prepare+unprepare
    pairs per second of the measured window; latencies are per call, under that load.
    `pairs_total` counts every pair, warm-up and the last ones past the window included."""
    async with AsyncExitStack() as stack:
        if channel_per_caller:
            channels = [await stack.enter_async_context(_channel(socket)) for _ in claims]
        else:
            channels = [await stack.enter_async_context(_channel(socket))] * len(claims)
        for channel in set(channels):
            await channel.channel_ready()
        measure_from = time.perf_counter() + warmup_s
        until = measure_from + duration_s
        per_caller = await asyncio.gather(
            *(
                _caller(KubeletClient(channel), ClaimCalls.of([claim]), measure_from, until)
                for channel, claim in zip(channels, claims, strict=True)
            )
        )
    pairs = sum(len(times.pairs_done_at) for times in per_caller)
    return {
        "callers": len(claims),
        "channels": len(set(channels)),
        "warmup_s": warmup_s,
        "duration_s": duration_s,
        "pairs": pairs,
        "pairs_total": sum(times.pairs_total for times in per_caller),
        "claims_per_s": pairs / duration_s,
        "pairs_per_caller_min": min(len(times.pairs_done_at) for times in per_caller),
        "pairs_per_caller_max": max(len(times.pairs_done_at) for times in per_caller),
        "prepare": percentiles([sample for times in per_caller for sample in times.prepare]),
        "unprepare": percentiles([sample for times in per_caller for sample in times.unprepare]),
    }
