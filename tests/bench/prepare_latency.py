"""Benchmark: NodePrepareResources / NodeUnprepareResources through the socket, as kubelet calls them.

Three processes, as on a node: the stand-in API server, the node agent (a simulated node of 16
whole H100s, described by a node file this writes into its work directory), and this client
(tests/bench/kubelet_load.py), which does what kubelet does. The agent's state directory (its
claim records and device metadata files, not flushed, as the chart runs it) is on a journaled
ext4 made for each use (`--state-fs`); the CDI directory is on tmpfs, like /var/run/cdi. Claims
are created and allocated on the stand-in as the scheduler would, claim i on GPU i, fresh ones
every run. Every round unprepares what it prepared, so every prepare does the full work: GET the
claim, check it, write the metadata file, the CDI spec and the record.

Why a file system of its own: a node keeps the state on its root or /var/lib file system, ext4
or XFS with a journal. This machine's root file system is ext4 without a journal, and there ext4
skips every inode deleted in the last 60 to 360 seconds when it allocates one (the kernel's
`recently_deleted`), so a benchmark that creates and deletes thousands of files a second makes
each creation slower the longer it runs (an `open(O_CREAT)` from 11 µs to 41 µs within 40 s,
while a journaled ext4 stays at 12 µs), a cost no node pays. `--state-fs disk` keeps the state
under the work directory, on whatever file system that is; `tmpfs` puts it on /dev/shm.

Figures, each measured `--runs` times:

- single: one claim per call, prepare then unprepare, `--rounds` rounds after 100 of warm-up;
- batch: one NodePrepareResources with 8 claims (8 GPUs), then one NodeUnprepareResources of the
  8, `--batch-rounds` rounds after 100 of warm-up;
- concurrent: `--callers` callers (16, then 8, by default) on one shared channel (kubelet keeps
  one connection per plugin), each preparing and unpreparing its own claim on its own GPU in a
  loop: completed prepare+unprepare pairs per second and per-call latency, over `--duration` s
  after `--warmup` s; the 16-caller figure is `concurrent` in the results, another count N is
  `concurrent_N`;
- of the agent: its resident memory after all of these (and after each), and the time from
  spawning it to registered with kubelet (GetInfo and NotifyRegistrationStatus answered);
- first: a fresh agent started `--first-starts` times, each time its first prepare (one claim,
  on a channel connected before the clock starts, as the steady figures' is) timed as soon as
  it has registered, and its time from spawn to registered; reported beside the 1-claim figure's
  p50. `--dirty-mib` N writes N MiB, not flushed, beside the agent's state before each start:
  a node whose disk was just written by others (image pulls, logs), which the first `syncfs`
  of the state's filesystem paid for (the group commit's, until issue 50 part 6).

Every figure also records the CPU time (user + system, all threads) the plugin process and this
client spent per round, a round being one prepare call and one unprepare call, warm-up included.

The floor of every figure is the same client against tests/bench/null_plugin.py, a server that
does no work: what the client, gRPC and the socket cost by themselves on this machine. Each run's
`against_floor` (printed last on its line) holds the agent's figures as multiples of the floor's,
as issue 31 states its targets: the 1-claim and the 8-claim prepare p50 against the floor's
1-claim prepare p50, each caller count's claims/s against the floor's.

`--engine-times` reads the agent's prepare, claim GET and unprepare histograms from its /metrics
before and after each figure, and records their means per claim (`engine`): where a prepare's
time goes, the API server's part included. Reading /metrics loads the exposition code into the
agent, so such a run's RSS is not `make bench`'s.

`--profile DIR` samples the agent with py-spy (installed next to this interpreter, not a project
dependency) during each figure, one raw collapsed-stack file per figure and run (`--profile-mode`:
the GIL holder, every thread, or the GIL holder with C frames); summarise them with
tests/bench/profile_summary.py. Sampling takes CPU from the same cores, so a profiled run's
numbers are marked as such in the output and are not the ones to report.

Run: `make bench` (or `python -m tests.bench.prepare_latency --rounds 2000 --runs 2 --output
docs/bench/prepare-latency.json`); quicker: `--only concurrent --runs 1 --first-starts 0`.
"""

import argparse
import asyncio
import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.tools.kubelet_client import register
from tests.bench.kubelet_load import (
    KUBELET_DEADLINE_SECONDS,
    WARMUP_ROUNDS,
    ClaimCalls,
    KubeletClient,
    measure,
    measure_calls,
    measure_concurrent,
    percentiles,
)
from tests.bench.standin import bench_workspace
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate
from tests.support.image import IMAGE_ENVIRONMENT, compile_like_the_image
from tests.support.waiting import wait_until

# tests/bench/memory.py runs the one-claim loop from here.
__all__ = ["main", "measure"]

FIGURES = ("single", "batch", "concurrent")
# The concurrent figure's caller counts: 16 as in every earlier round's results, and 8, which
# issue 31's target is stated for.
CALLERS = (16, 8)
BATCH_CLAIMS = 8
# Where the agent's state directory is (see the module docstring), and the size of the ext4 made
# for it: the records and metadata files of 16 claims need a few MiB at most.
STATE_FILESYSTEMS = ("ext4", "disk", "tmpfs")
STATE_FS_MIB = 256
# 16 whole GPUs, so that every concurrent caller has a device of its own (the simulated maximum).
NODE_FILE = """\
# Written by tests/bench/prepare_latency.py: 16 whole GPUs (devices gpu-0 ... gpu-15).
gpus:
  - {model: H100-SXM5-80GB, count: 8}
  - {model: H100-SXM5-80GB, count: 8}
"""
PROFILE_RATE_HZ = 250
# What py-spy samples, by --profile-mode. "gil": only the thread holding the GIL, i.e. the agent's
# Python and the C it calls without releasing the GIL, which is what bounds its throughput.
# "all": every thread on a CPU; py-spy's idle detection is approximate when it does not stop the
# process, so threads waiting in epoll, a queue or fsync show up too. "native": the GIL holder
# with C frames (grpc's core, libc), which needs the process stopped for every sample.
PROFILE_MODES: dict[str, tuple[str, ...]] = {
    "gil": ("--nonblocking", "--gil"),
    "all": ("--nonblocking",),
    "native": ("--gil", "--native"),
}


@dataclass(frozen=True)
class Plan:
    """What each run measures, from the command line."""

    figures: tuple[str, ...]
    rounds: int
    batch_rounds: int
    duration_s: float
    warmup_s: float
    channel_per_caller: bool
    profile_dir: Path | None
    profile_mode: str = "gil"
    first_starts: int = 0
    dirty_mib: int = 0
    callers: tuple[int, ...] = CALLERS
    engine_times: bool = False
    state_fs: str = "ext4"


Sampler = Callable[[str], AbstractContextManager[object]]
# What the agent's /metrics says its engine spent per claim: sum and count of each histogram.
EngineTotals = dict[str, tuple[float, float]]

ENGINE_HISTOGRAMS = {
    "prepare": "dra_driver_prepare_duration_seconds",
    "claim_get": "dra_driver_claim_get_duration_seconds",
    "unprepare": "dra_driver_unprepare_duration_seconds",
}


def concurrent_key(callers: int) -> str:
    """Where the figure of `callers` concurrent callers goes in the results."""
    return "concurrent" if callers == CALLERS[0] else f"concurrent_{callers}"


def callers_of(key: str) -> int:
    """The caller count of a concurrent figure's key in the results (`concurrent_key`'s inverse)."""
    return CALLERS[0] if key == "concurrent" else int(key.removeprefix("concurrent_"))


def _measured(plan: Plan) -> list[str]:
    """The figures of `plan` by their keys in the results, one per caller count."""
    keys = []
    for figure in plan.figures:
        keys += [concurrent_key(n) for n in plan.callers] if figure == "concurrent" else [figure]
    return keys


def _figure(figure: str, socket: Path, claims: Sequence[Any], plan: Plan) -> tuple[dict[str, Any], int]:
    """Runs one figure (a key of `_measured`); returns its result and how many rounds (one
    prepare call and one unprepare call each) it made, warm-up included."""
    if figure == "single":
        return asyncio.run(measure(socket, claims[0], plan.rounds)), WARMUP_ROUNDS + plan.rounds
    if figure == "batch":
        batch = asyncio.run(measure_calls(socket, claims[:BATCH_CLAIMS], plan.batch_rounds))
        return {"claims_per_call": BATCH_CLAIMS, **batch}, WARMUP_ROUNDS + plan.batch_rounds
    callers = callers_of(figure)
    concurrent = asyncio.run(
        measure_concurrent(socket, claims[:callers], plan.duration_s, plan.warmup_s, plan.channel_per_caller)
    )
    return concurrent, concurrent["pairs_total"]


def run_figures(
    socket: Path,
    claims: Sequence[Any],
    plan: Plan,
    pid: int,
    sample: Sampler,
    engine_totals: Callable[[], EngineTotals] | None = None,
) -> dict[str, Any]:
    """Every figure of `plan` against the plugin at `socket` (process `pid`), each inside
    `sample(figure)`. The one-claim figure keeps the top-level keys it always had.

    Besides latencies, each figure records the CPU time the plugin process and this client spent
    per round: on a shared 2-core machine the latencies move with other work, CPU per round less
    so, and it says how far from a saturated core a figure is. `engine_totals`: where the
    agent's engine histograms are read before and after each figure (its means go in `engine`)."""
    figures: dict[str, Any] = {}
    rss_after: dict[str, float] = {}
    for figure in _measured(plan):
        totals_before = None if engine_totals is None else engine_totals()
        with sample(figure):
            server_before, client_before = cpu_seconds(pid), time.process_time()
            result, rounds = _figure(figure, socket, claims, plan)
            server_s, client_s = cpu_seconds(pid) - server_before, time.process_time() - client_before
        result["cpu_ms_per_round"] = {"server": server_s * 1e3 / rounds, "client": client_s * 1e3 / rounds}
        rss_after[figure] = rss_mib(pid)
        if engine_totals is not None and totals_before is not None:
            result["engine"] = engine_means(totals_before, engine_totals())
        if figure == "single":
            figures.update(result)
        else:
            figures[figure] = result
    figures["rss_mib_after_each"] = rss_after
    return figures


def engine_totals_of(agent: AgentProcess) -> EngineTotals:
    """Sum and count of each of ENGINE_HISTOGRAMS, from the agent's /metrics."""
    values = {name: value for (name, labels), value in agent.scrape().items() if not labels}
    return {
        part: (values[f"{name}_sum"], values[f"{name}_count"]) for part, name in ENGINE_HISTOGRAMS.items()
    }


def engine_means(before: EngineTotals, after: EngineTotals) -> dict[str, float | None]:
    """Mean milliseconds per claim of each histogram between two readings (None: no claim)."""
    means: dict[str, float | None] = {}
    for part, (total_after, count_after) in after.items():
        total_before, count_before = before[part]
        count = count_after - count_before
        means[f"{part}_mean_ms"] = round((total_after - total_before) / count * 1e3, 3) if count else None
    return means


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid`, every thread, from /proc/<pid>/stat."""
    # The fields after the parenthesised command name start at field 3 (state); 14 and 15 are
    # utime and stime, in clock ticks.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def py_spy() -> str:
    """py-spy installed next to this interpreter (`pip install py-spy`), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    return found


@contextmanager
def sampled(pid: int, output: Path, mode: str) -> Iterator[None]:
    """py-spy samples process `pid` as PROFILE_MODES[mode] says while the body runs, and writes
    collapsed stacks, thread by thread, to `output`. Attaching by PID needs ptrace rights over
    the process."""
    sampler = subprocess.Popen(
        [
            py_spy(),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(PROFILE_RATE_HZ),
            "--threads",
            *PROFILE_MODES[mode],
            "--format",
            "raw",
            "--output",
            str(output),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert sampler.stdout is not None
    # py-spy says "Sampling process ..." once attached; without that line it failed to attach.
    first_line = sampler.stdout.readline()
    if "Sampling" not in first_line:
        sampler.wait(10)
        raise RuntimeError(f"py-spy could not sample the agent: {first_line}{sampler.stdout.read()}")
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)
        sampler.communicate(timeout=120)


def allocate_claims(kubeconfig: Path) -> list[Any]:
    """One fresh claim per GPU, claim i allocated GPU i, as kubelet would then name them."""
    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        api = client.ResourceV1Api(api_client)
        stamp = time.monotonic_ns()
        claims = []
        for gpu in range(max(CALLERS)):
            name = f"bench-{stamp}-{gpu}"
            uid = allocate(api, name, {"gpu": f"gpu-{gpu}"}, pool=NODE_NAME)
            claims.append(v1_pb2.Claim(namespace="default", name=name, uid=uid))
        return claims
    finally:
        api_client.close()


@contextmanager
def benchmark_agent(
    work: Path,
    kubeconfig: Path,
    hardware: str,
    *,
    env: Mapping[str, str] | None = None,
    wrapper: Sequence[str] = (),
    stop_timeout: float = 30.0,
    state_dir: Path | None = None,
) -> Iterator[AgentProcess]:
    """The agent on `hardware` as its image runs it (plus `env`), its CDI specs on tmpfs as
    /var/run/cdi is, just spawned; stopped and its specs removed on leaving. `state_dir`: its
    `--state-dir` (default: under `work`, on the disk, as the chart keeps it)."""
    cdi_dir = Path(tempfile.mkdtemp(prefix="dra-bench-cdi-", dir="/dev/shm"))
    state = () if state_dir is None else ("--state-dir", str(state_dir))
    agent = start_agent(
        AgentDirs(root=work / "node"),
        kubeconfig,
        hardware=hardware,
        extra=("--cdi-dir", str(cdi_dir), *state),
        wait=False,
        env={**IMAGE_ENVIRONMENT, **(env or {})},
        wrapper=wrapper,
    )
    try:
        yield agent
    finally:
        agent.terminate(timeout=stop_timeout)
        shutil.rmtree(cdi_dir, ignore_errors=True)


def run_agent_benchmark(
    work: Path,
    kubeconfig: Path,
    node_file: Path,
    claims: Sequence[Any],
    plan: Plan,
    run: int,
    state_dir: Path | None = None,
) -> dict[str, Any]:
    spawned = time.monotonic()
    with benchmark_agent(work, kubeconfig, f"simulated:{node_file}", state_dir=state_dir) as agent:
        dirs, pid = agent.dirs, agent.process.pid

        def sample(figure: str) -> AbstractContextManager[object]:
            if plan.profile_dir is None:
                return nullcontext()
            return sampled(pid, plan.profile_dir / f"{figure}-run{run + 1}.txt", plan.profile_mode)

        wait_until(dirs.registration_socket.exists, timeout=30, interval=0.002)
        asyncio.run(register(dirs.registration_socket))
        registered_s = time.monotonic() - spawned
        engine_totals = functools.partial(engine_totals_of, agent) if plan.engine_times else None
        figures = run_figures(dirs.dra_socket, claims, plan, pid, sample, engine_totals)
        figures["agent_rss_mib_after"] = rss_mib(pid)
        figures["start_to_registered_s"] = registered_s
    return figures


async def first_answer(socket: Path) -> None:
    """An empty NodeUnprepareResources, answered: the plugin is serving. The socket file exists
    from the bind, before the server listens (a window valgrind widens until a connection is
    refused), so the call waits for the channel to connect."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        await stub.NodeUnprepareResources(
            v1_pb2.NodeUnprepareResourcesRequest(), timeout=KUBELET_DEADLINE_SECONDS, wait_for_ready=True
        )


async def first_prepare(socket: Path, claim: Any) -> float:
    """Seconds of the first NodePrepareResources the plugin at `socket` answers (the claim is
    unprepared after), on a channel connected before the clock starts."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        await asyncio.wait_for(channel.channel_ready(), KUBELET_DEADLINE_SECONDS)
        kubelet, calls = KubeletClient(channel), ClaimCalls.of([claim])
        elapsed = await kubelet.prepare(calls)
        await kubelet.unprepare(calls)
        return elapsed


def write_unflushed(path: Path, mib: int) -> None:
    """`mib` MiB of data in the page cache, not yet on disk (the kernel writes it back within
    about 30 s, or a sync of its filesystem does)."""
    with path.open("wb") as file:
        for _ in range(mib):
            file.write(os.urandom(2**20))


def run_first_prepare_benchmark(
    work: Path,
    kubeconfig: Path,
    node_file: Path,
    claims: Sequence[Any],
    plan: Plan,
    state_dir: Path | None = None,
) -> dict[str, Any]:
    """`plan.first_starts` fresh agents, one after the other on one state directory (as restarts
    on a node are), each asked to prepare as soon as it has registered."""
    firsts: list[float] = []
    registered: list[float] = []
    work.mkdir(parents=True, exist_ok=True)
    dirty = work / "dirty.bin"
    for start in range(plan.first_starts):
        if plan.dirty_mib:
            write_unflushed(dirty, plan.dirty_mib)
        spawned = time.monotonic()
        with benchmark_agent(work, kubeconfig, f"simulated:{node_file}", state_dir=state_dir) as agent:
            wait_until(agent.dirs.registration_socket.exists, timeout=30, interval=0.002)
            asyncio.run(register(agent.dirs.registration_socket))
            registered.append(time.monotonic() - spawned)
            firsts.append(asyncio.run(first_prepare(agent.dirs.dra_socket, claims[start % len(claims)])))
        dirty.unlink(missing_ok=True)
    return {
        "starts": plan.first_starts,
        "dirty_mib": plan.dirty_mib,
        "prepare_ms": [round(first * 1e3, 3) for first in firsts],
        "prepare": percentiles(firsts),
        "start_to_registered": percentiles(registered),
    }


def run_floor_benchmark(work: Path, claims: Sequence[Any], plan: Plan) -> dict[str, Any]:
    socket = work / "null.sock"
    spawned = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "tests.bench.null_plugin", str(socket)])
    try:
        wait_until(socket.exists, timeout=30, interval=0.002)
        asyncio.run(first_answer(socket))
        serving_s = time.monotonic() - spawned
        figures = run_figures(socket, claims, plan, server.pid, lambda _figure: nullcontext())
        figures["rss_mib_after"] = rss_mib(server.pid)
        figures["start_to_first_answer_s"] = serving_s
        return figures
    finally:
        server.terminate()
        server.wait(10)


def _latency(figure: dict[str, Any]) -> str:
    prepare, unprepare = figure["prepare"], figure["unprepare"]
    engine = figure.get("engine")
    return (
        f"prepare p50 {prepare['p50_ms']:.2f} p99 {prepare['p99_ms']:.2f} ms, "
        f"unprepare p50 {unprepare['p50_ms']:.2f} p99 {unprepare['p99_ms']:.2f} ms, "
        f"CPU {figure['cpu_ms_per_round']['server']:.2f} ms/round"
        + ("" if engine is None else f", engine per claim: {_engine_means(engine)}")
    )


def _engine_means(engine: dict[str, float | None]) -> str:
    def ms(part: str) -> str:
        mean = engine[f"{part}_mean_ms"]
        return "-" if mean is None else f"{mean:.2f}"

    return f"prepare {ms('prepare')} (claim GET {ms('claim_get')}), unprepare {ms('unprepare')} ms"


def against_floor(agent: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """The agent's figures as multiples of the same run's floor, as issue 31 states its targets:
    prepare p50s against the floor's 1-claim prepare p50 (the 8-claim call too), throughput
    against the floor's with as many callers."""
    ratios = {}
    if "prepare" in agent:
        single = floor["prepare"]["p50_ms"]
        ratios["prepare_p50"] = agent["prepare"]["p50_ms"] / single
        if "batch" in agent:
            ratios["batch_prepare_p50"] = agent["batch"]["prepare"]["p50_ms"] / single
    for key in (key for key in agent if key.startswith("concurrent")):
        ratios[f"{key}_claims_per_s"] = agent[key]["claims_per_s"] / floor[key]["claims_per_s"]
    return {name: round(ratio, 3) for name, ratio in ratios.items()}


def _ratios(ratios: dict[str, float]) -> str:
    named = {"prepare_p50": "1 claim", "batch_prepare_p50": f"{BATCH_CLAIMS} claims/call"}
    parts = [f"{named[name]} {ratios[name]:.1f}x" for name in named if name in ratios]
    for name in sorted(name for name in ratios if name.startswith("concurrent")):
        parts.append(f"{callers_of(name.removesuffix('_claims_per_s'))} callers {ratios[name]:.2f}x")
    return ", ".join(parts)


def summary(agent: dict[str, Any], floor: dict[str, Any]) -> str:
    """One line per run: each figure of the agent, with its floor's p50 (or rate) in brackets."""
    parts = []
    if "prepare" in agent:
        parts.append(
            f"1 claim: {_latency(agent)} "
            f"[floor {floor['prepare']['p50_ms']:.2f} / {floor['unprepare']['p50_ms']:.2f} ms]"
        )
    if "batch" in agent:
        batch, floor_batch = agent["batch"], floor["batch"]
        parts.append(
            f"{batch['claims_per_call']} claims/call: {_latency(batch)} "
            f"[floor {floor_batch['prepare']['p50_ms']:.2f} / {floor_batch['unprepare']['p50_ms']:.2f} ms]"
        )
    for key in sorted(key for key in agent if key.startswith("concurrent")):
        concurrent = agent[key]
        parts.append(
            f"{concurrent['callers']} callers: {concurrent['claims_per_s']:.0f} claims/s, "
            f"{_latency(concurrent)} [floor {floor[key]['claims_per_s']:.0f} claims/s]"
        )
    parts.append(f"RSS {agent['agent_rss_mib_after']:.1f} MiB")
    parts.append(f"start to registered {agent['start_to_registered_s']:.2f} s")
    if "first" in agent:
        first = agent["first"]
        ratio = f" ({first['vs_steady_p50']:.1f}x steady p50)" if "vs_steady_p50" in first else ""
        parts.append(
            f"first prepare of {first['starts']} starts: p50 {first['prepare']['p50_ms']:.2f} "
            f"max {first['prepare']['max_ms']:.2f} ms{ratio}, start to registered p50 "
            f"{first['start_to_registered']['p50_ms'] / 1e3:.2f} s"
        )
    if ratios := against_floor(agent, floor):
        parts.append(f"against the floor's 1-claim p50 and claims/s: {_ratios(ratios)}")
    return " | ".join(parts)


def parse_plan() -> tuple[Plan, int, Path | None]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000, help="measured rounds of the 1-claim figure")
    parser.add_argument(
        "--batch-rounds", type=int, help="measured rounds of the 8-claim figure (default: --rounds)"
    )
    parser.add_argument(
        "--duration", type=float, default=5.0, help="seconds the concurrent figure is measured"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of concurrent load before it is measured"
    )
    parser.add_argument("--runs", type=int, default=2, help="repeat every figure this many times")
    parser.add_argument(
        "--only", nargs="+", choices=FIGURES, default=list(FIGURES), help="run only these figures"
    )
    parser.add_argument(
        "--channel-per-caller",
        action="store_true",
        help="concurrent callers each on their own channel, instead of one shared as kubelet does",
    )
    parser.add_argument(
        "--callers",
        type=int,
        nargs="+",
        choices=range(1, max(CALLERS) + 1),
        default=list(CALLERS),
        metavar="N",
        help=f"caller counts of the concurrent figure, each at most {max(CALLERS)} (default: %(default)s)",
    )
    parser.add_argument("--profile", type=Path, metavar="DIR", help="sample the agent with py-spy into DIR")
    parser.add_argument(
        "--profile-mode", choices=PROFILE_MODES, default="gil", help="what py-spy samples (see PROFILE_MODES)"
    )
    parser.add_argument(
        "--first-starts",
        type=int,
        default=10,
        help="fresh agents started, each timed on its first prepare (0: not measured)",
    )
    parser.add_argument(
        "--dirty-mib",
        type=int,
        default=0,
        help="MiB written, not flushed, beside the agent's state before each of those starts",
    )
    parser.add_argument(
        "--engine-times",
        action="store_true",
        help="read the agent's engine histograms from its /metrics around each figure",
    )
    parser.add_argument(
        "--state-fs",
        choices=STATE_FILESYSTEMS,
        default=STATE_FILESYSTEMS[0],
        help="the agent's --state-dir: on a journaled ext4 made for it (needs root), under the work "
        "directory, or on /dev/shm (default: %(default)s)",
    )
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    plan = Plan(
        figures=tuple(figure for figure in FIGURES if figure in args.only),
        rounds=args.rounds,
        batch_rounds=args.rounds if args.batch_rounds is None else args.batch_rounds,
        duration_s=args.duration,
        warmup_s=args.warmup,
        channel_per_caller=args.channel_per_caller,
        profile_dir=args.profile,
        profile_mode=args.profile_mode,
        first_starts=args.first_starts,
        dirty_mib=args.dirty_mib,
        callers=tuple(args.callers),
        engine_times=args.engine_times,
        state_fs=args.state_fs,
    )
    return plan, args.runs, args.output


@contextmanager
def agent_state(plan: Plan) -> Iterator[Path | None]:
    """The agent's state directory, as `plan.state_fs` says: None (its default, under the work
    directory), or a new one for each use, on a journaled ext4 or on tmpfs, removed after it."""
    if plan.state_fs == "disk":
        yield None
        return
    if plan.state_fs == "ext4":
        with journaled_ext4() as mounted:
            yield mounted
        return
    state_dir = Path(tempfile.mkdtemp(prefix="dra-bench-state-", dir="/dev/shm"))
    try:
        yield state_dir
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def check_state_fs(state_fs: str) -> None:
    """Exits with what to do where `state_fs` cannot be had here, before anything has run."""
    if state_fs != "ext4":
        return
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        reason = f"{', '.join(missing)} not found" if missing else "mounting it needs root"
        raise SystemExit(
            f"--state-fs ext4: {reason}; run as root with e2fsprogs installed, or pass --state-fs disk"
        )


@contextmanager
def journaled_ext4() -> Iterator[Path]:
    """A new ext4 as mkfs.ext4 makes it by default (with its journal, as on a node), on a loop
    device over a sparse image in the temporary directory; mounted for the body, then unmounted
    and removed."""
    work = Path(tempfile.mkdtemp(prefix="dra-bench-ext4-"))
    image, mounted = work / "state.img", work / "state"
    mounted.mkdir()
    with image.open("wb") as file:
        file.truncate(STATE_FS_MIB * 2**20)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mounted)], check=True)
        try:
            yield mounted
        finally:
            subprocess.run(["umount", str(mounted)], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    plan, runs, output = parse_plan()
    check_state_fs(plan.state_fs)
    results: dict[str, Any] = {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "node": NODE_FILE,
        "figures": list(plan.figures),
        "rounds": plan.rounds,
        "batch_rounds": plan.batch_rounds,
        "warmup_rounds": WARMUP_ROUNDS,
        "first_starts": plan.first_starts,
        "dirty_mib": plan.dirty_mib,
        "agent_state": plan.state_fs,
        # Reading /metrics loads the exposition code into the agent: its RSS figures then differ.
        "engine_times": plan.engine_times,
        "concurrent": {
            "callers": list(plan.callers),
            "duration_s": plan.duration_s,
            "warmup_s": plan.warmup_s,
            "channel": "one per caller" if plan.channel_per_caller else "one, shared",
        },
        # Sampling slows the agent: a profiled run's figures are not the ones to report.
        "profiled_with": None if plan.profile_dir is None else ["py-spy", *PROFILE_MODES[plan.profile_mode]],
        "runs": [],
    }
    compile_like_the_image()
    with bench_workspace() as (work, kubeconfig):
        node_file = work / "node.yaml"
        node_file.write_text(NODE_FILE)
        for run in range(runs):
            run_dir = work / f"run{run}"
            run_dir.mkdir()
            load_before = os.getloadavg()
            claims = allocate_claims(kubeconfig)
            floor = run_floor_benchmark(run_dir, claims, plan)
            with agent_state(plan) as state_dir:
                agent = run_agent_benchmark(run_dir, kubeconfig, node_file, claims, plan, run, state_dir)
            if plan.first_starts:
                with agent_state(plan) as state_dir:
                    first = run_first_prepare_benchmark(
                        run_dir / "first", kubeconfig, node_file, claims, plan, state_dir
                    )
                if "prepare" in agent:
                    first["vs_steady_p50"] = first["prepare"]["p50_ms"] / agent["prepare"]["p50_ms"]
                agent["first"] = first
            load = {"before": load_before, "after": os.getloadavg()}
            results["runs"].append(
                {
                    "floor": floor,
                    "agent": agent,
                    "against_floor": against_floor(agent, floor),
                    "load_average": load,
                }
            )
            print(f"run {run + 1} (load {load_before[0]:.2f}): {summary(agent, floor)}", flush=True)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
