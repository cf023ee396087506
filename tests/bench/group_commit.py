"""Micro-benchmark: N concurrent durable writes, one fsync pair per file vs one group commit.

Per round, `--ops` claim-record-sized files are written concurrently, as overlapping kubelet
calls would: either each through durable_files.atomic_write in asyncio's default thread pool
(fsync file, rename, fsync directory, per file) or all through one GroupCommitter (one syncfs per
batch, one directory fsync per batch). Both rewrite the same files every round. The numbers
depend entirely on the disk under `--directory`: put it on the filesystem the state directory
would use (tmpfs makes every flush free).

Run: `python -m tests.bench.group_commit --ops 64 --rounds 50 --directory /var/tmp`.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from dra_driver.state import durable_files
from dra_driver.state.group_commit import GroupCommitter

RECORD = b'{"version":1,"claim":{"namespace":"default","name":"gpu-claim","uid":"%d"},"devices":[]}'


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "min_ms": min(samples) * 1e3,
        "max_ms": max(samples) * 1e3,
    }


async def per_file(paths: list[Path]) -> None:
    await asyncio.gather(
        *(
            asyncio.to_thread(partial(durable_files.atomic_write, path, RECORD % n, durable=True, mode=0o600))
            for n, path in enumerate(paths)
        )
    )


async def grouped(committer: GroupCommitter, paths: list[Path]) -> None:
    await asyncio.gather(*(committer.replace(path, RECORD % n) for n, path in enumerate(paths)))


async def measure(directory: Path, ops: int, rounds: int) -> dict[str, Any]:
    paths = [directory / f"claim-{n}.json" for n in range(ops)]
    committer = GroupCommitter()
    per_file_times: list[float] = []
    grouped_times: list[float] = []
    for _ in range(rounds):  # interleaved, so drift in the disk's speed hits both alike
        start = time.perf_counter()
        await per_file(paths)
        per_file_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        await grouped(committer, paths)
        grouped_times.append(time.perf_counter() - start)
    await committer.close()
    return {
        "per_file_atomic_write": summary(per_file_times),
        "group_commit": summary(grouped_times)
        | {
            "flushes_per_round": committer.flushes / rounds,
            "operations_per_round": committer.operations / rounds,
        },
        "speedup_median": statistics.median(per_file_times) / statistics.median(grouped_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=64, help="concurrent writes per round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--directory", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="group-commit-", dir=args.directory) as where:
        results = asyncio.run(measure(Path(where), args.ops, args.rounds))
        results["setup"] = {
            "ops": args.ops,
            "rounds": args.rounds,
            "directory": where,
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
