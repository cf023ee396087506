"""Benchmark: instructions the node agent executes per prepare+unprepare round, counted by callgrind.

Why a count and not only times: on this shared 2-core machine the CPU time of the same work moves
30-45 % from one half hour to the next (docs/benchmarks.md), more than most single changes to the
agent gain or lose. The number of instructions a round executes does not depend on the machine's
load, so it tells whether a change made the agent cheaper, and by how much, in one run.

Method: the harness of tests/bench/prepare_latency.py (the stand-in API server, a simulated node of
16 whole H100s, a client doing what kubelet does over the agent's unix socket, the image's
`PYTHONOPTIMIZE=2`), with the agent run under `valgrind --tool=callgrind`, which counts every
instruction of every thread of the process in user space. Each figure is measured twice, in two
fresh agents that differ only in how many measured rounds they serve after the same warm-up:
instructions per round = (count with `--rounds` x 4 - count with `--rounds`) / (3 x `--rounds`),
which cancels start-up, warm-up and shutdown. A round is one NodePrepareResources and one
NodeUnprepareResources: of one claim (`single`) or of 8 claims in each call (`batch`). The floor
is the same for tests/bench/null_plugin.py, the server that does no work.

What it does not count: time in the kernel (the fsyncs, file system calls, socket I/O) and time
spent waiting.

Run: `python -m tests.bench.agent_instructions --runs 2 --output docs/bench/agent-instructions.json`
(valgrind on PATH: `apt-get install valgrind`; about ten minutes).
"""

import argparse
import asyncio
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.bench.kubelet_load import measure_calls
from tests.bench.prepare_latency import (
    BATCH_CLAIMS,
    NODE_FILE,
    allocate_claims,
    benchmark_agent,
    first_answer,
)
from tests.bench.standin import bench_workspace
from tests.support.image import compile_like_the_image
from tests.support.waiting import wait_until

FIGURES = {"single": 1, "batch": BATCH_CLAIMS}  # claims per call
SERVERS = ("agent", "floor")
WARMUP_ROUNDS = 20
MORE_ROUNDS_FACTOR = 4
# Under callgrind Python runs some 50 times slower: the agent takes half a minute to start.
START_TIMEOUT_SECONDS = 300.0
STOP_TIMEOUT_SECONDS = 120.0
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)$", re.MULTILINE)


def valgrind() -> str:
    found = shutil.which("valgrind")
    if found is None:
        raise SystemExit("agent_instructions needs valgrind on PATH: apt-get install valgrind")
    return found


def callgrind_command(output: Path) -> list[str]:
    return [valgrind(), "--tool=callgrind", f"--callgrind-out-file={output}"]


def instructions_counted(output: Path) -> int:
    """The whole process's instruction count from a callgrind output file."""
    found = _TOTALS.search(output.read_bytes())
    if found is None:
        raise RuntimeError(f"{output}: no instruction total (did the process exit normally?)")
    return int(found.group(1))


@contextmanager
def serving(server: str, work: Path, kubeconfig: Path, output: Path) -> Iterator[Path]:
    """A fresh agent (or do-nothing server) under callgrind, answering on the socket yielded; it
    is stopped on leaving, which writes its counts to `output`."""
    wrapper = callgrind_command(output)
    with ExitStack() as stack:
        if server == "floor":
            socket = work / "null.sock"
            process = subprocess.Popen(
                [*wrapper, sys.executable, "-m", "tests.bench.null_plugin", str(socket)]
            )
            # Callbacks run last in, first out: terminate, then wait.
            stack.callback(process.wait, STOP_TIMEOUT_SECONDS)
            stack.callback(process.terminate)
        else:
            node_file = work / "node.yaml"
            node_file.write_text(NODE_FILE)
            agent = stack.enter_context(
                benchmark_agent(
                    work,
                    kubeconfig,
                    f"simulated:{node_file}",
                    wrapper=wrapper,
                    stop_timeout=STOP_TIMEOUT_SECONDS,
                )
            )
            socket = agent.dirs.dra_socket
        wait_until(socket.exists, timeout=START_TIMEOUT_SECONDS, interval=0.05)
        asyncio.run(first_answer(socket))
        yield socket


def count(server: str, figure: str, rounds: int, kubeconfig: Path, work: Path) -> int:
    """Instructions of one fresh server that serves WARMUP_ROUNDS and then `rounds` of `figure`."""
    claims = allocate_claims(kubeconfig)[: FIGURES[figure]]
    output = work / "callgrind.out"
    with serving(server, work, kubeconfig, output) as socket:
        asyncio.run(measure_calls(socket, claims, rounds, WARMUP_ROUNDS))
    return instructions_counted(output)


def per_round(fewer: int, more: int, rounds: int) -> float:
    """Instructions of one round: what the extra rounds added, divided by their number."""
    extra_rounds = rounds * (MORE_ROUNDS_FACTOR - 1)
    if more <= fewer:
        raise RuntimeError(f"{extra_rounds} more rounds counted {more - fewer} more instructions")
    return (more - fewer) / extra_rounds


def measure_figure(server: str, figure: str, rounds: int, kubeconfig: Path, work: Path) -> dict[str, Any]:
    counts = []
    for served in (rounds, rounds * MORE_ROUNDS_FACTOR):
        run_dir = work / f"{server}-{figure}-{served}"
        run_dir.mkdir()
        counts.append(count(server, figure, served, kubeconfig, run_dir))
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "rounds": [rounds, rounds * MORE_ROUNDS_FACTOR],
        "instructions": counts,
        "per_round": per_round(counts[0], counts[1], rounds),
        "per_claim": per_round(counts[0], counts[1], rounds) / FIGURES[figure],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100, help="measured rounds of the 1-claim figure")
    parser.add_argument("--batch-rounds", type=int, default=25, help="measured rounds of the 8-claim figure")
    parser.add_argument("--runs", type=int, default=2, help="repeat every figure this many times")
    parser.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    rounds = {"single": args.rounds, "batch": args.batch_rounds}
    version = subprocess.run([valgrind(), "--version"], capture_output=True, text=True, check=True)
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "kernel": platform.release()},
        "valgrind": version.stdout.strip(),
        "warmup_rounds": WARMUP_ROUNDS,
        "runs": [],
    }
    compile_like_the_image()
    with bench_workspace() as (work, kubeconfig):
        for run in range(args.runs):
            figures: dict[str, Any] = {}
            for server in args.servers:
                for figure in args.only:
                    started = time.monotonic()
                    result = measure_figure(server, figure, rounds[figure], kubeconfig, work)
                    figures[f"{server} {figure}"] = result
                    print(
                        f"run {run + 1}: {server} {figure}: {result['per_round'] / 1e6:.3f} M "
                        f"instructions per round ({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
            results["runs"].append(figures)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
