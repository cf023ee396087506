"""Benchmark: a vGPU share's prepare and unprepare under vgpu.enforcement mps, with many claims on the node.

Counting the shares that use a GPU's MPS daemon once read every claim record on the node, on
every share's prepare and unprepare (issue 32), so the cost grew with the node's claims. This
measures that path in process: the claim engine as the agent wires it (records fsync'd, each on
its own, in `--directory`, which should be on the state directory's kind of disk), a
simulated node of eight H100s in vgpu-capacity mode, real simulated MPS control daemons.

`--others` shares are prepared first on GPUs 1 to 7 (their records stay on disk), and one on GPU 0
keeps GPU 0's daemon running; then each round prepares a fresh share on GPU 0 and unprepares it,
`--rounds` rounds after `--warmup`. Reported: p50 and p90 of prepare and of unprepare, and of
one probe of every GPU's daemon (what the agent does every --mps-probe-interval; the GPUs with
shares then: all eight, or GPU 0 alone with `--others 0`), in ms.

Run: `python -m tests.bench.gpu_mps_prepare --others 100 --rounds 300 --directory /var/tmp`.
"""

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import structlog

from dra_driver.claims.calls import RawClaim
from dra_driver.claims.engine import SharingControls
from dra_driver.claims.sharing.mps import SimulatedMps
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from tests.support.engines import simulated_engine
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import simulated_node

PROFILE = "dgx-h100"
CONFIG = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="mps"))


def _share(claims: MemoryClaims, name: str, gpu: int) -> RawClaim:
    capacity = {"memory": "1Gi", "cores": "1"}
    return claims.add(
        name, {"device": f"gpu-{gpu}", "shareID": str(uuid.uuid4()), "consumedCapacity": capacity}
    )


def _quantiles(samples: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(samples, n=10)
    return {"p50_ms": round(statistics.median(samples) * 1000, 3), "p90_ms": round(cuts[8] * 1000, 3)}


async def _measure(root: Path, others: int, rounds: int, warmup: int) -> dict[str, Any]:
    claims = MemoryClaims()
    gpus = simulated_node(PROFILE)
    sharing = SharingControls(SimulatedTimeSlicer(gpu.uuid for gpu in gpus), SimulatedMps(root / "mps"))
    engine = simulated_engine(root, claims, PROFILE, CONFIG, sharing=sharing)
    await engine.load_state()
    prepared = [_share(claims, f"other-{i}", 1 + i % (len(gpus) - 1)) for i in range(others)]
    prepared.append(_share(claims, "bystander", 0))
    for claim in prepared:
        answer = await engine.prepare([claim])
        assert not answer[claim.uid].error, answer[claim.uid].error
    prepare_s, unprepare_s = [], []
    for round_number in range(warmup + rounds):
        claim = _share(claims, f"round-{round_number}", 0)
        started = time.perf_counter()
        answer = await engine.prepare([claim])
        middle = time.perf_counter()
        errors = await engine.unprepare([claim])
        ended = time.perf_counter()
        assert not answer[claim.uid].error and not errors[claim.uid], (answer, errors)
        if round_number >= warmup:
            prepare_s.append(middle - started)
            unprepare_s.append(ended - middle)
    probe_s = []
    for _ in range(rounds):
        started = time.perf_counter()
        await engine.probe_gpu_daemons()
        probe_s.append(time.perf_counter() - started)
    await engine.unprepare(prepared)
    engine.close()
    return {
        "prepare": _quantiles(prepare_s),
        "unprepare": _quantiles(unprepare_s),
        "probe": _quantiles(probe_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--others", type=int, default=100, help="other claims' shares prepared on the node")
    parser.add_argument("--rounds", type=int, default=300, help="measured prepare+unprepare rounds")
    parser.add_argument("--warmup", type=int, default=30, help="rounds before the measured ones")
    parser.add_argument("--directory", type=Path, default=Path("/var/tmp"), help="where the state goes")
    args = parser.parse_args()
    # The engine logs every claim; the figures are about the work, not the console.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(prefix="mps-bench-", dir=args.directory) as root:
        result = asyncio.run(_measure(Path(root), args.others, args.rounds, args.warmup))
    print(json.dumps({"others": args.others, "rounds": args.rounds, **result}))


if __name__ == "__main__":
    main()
