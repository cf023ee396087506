"""Seeded traces of mixed pods for the cluster benchmark, written in `plan --trace` format.

Pods arrive as a Poisson process and each stays for an exponential lifetime (mean one hour),
at a rate that offers `load` times the fleet's GPUs on average, so the fleet runs full and the
order devices are handed out in decides what is refused. The mix (share of arrivals) is what an
inference-heavy GPU cluster sees, with the training jobs that fragmentation starves:
- whole GPUs: 1 GPU 10 %, 2 GPUs 5 %, 8 GPUs (a whole node) 2 %;
- MIG profiles: 1g.10gb 18 %, 2g.20gb 8 %, 3g.40gb 6 %, 7g.80gb 1 %;
- vGPU shares of memory and cores: 10 GiB/15 % 25 %, 20 GiB/30 % 15 %, 40 GiB/50 % 10 %.
The shares' memory is that of the MIG profiles rounded up to whole GiB, so a vGPU fleet cuts
three partition sizes, not seven.
"""

import random
from typing import Any

from dra_driver.packing.shapes import PodShape, parse_shape
from dra_driver.packing.trace_file import Trace, parse_trace

MIX: tuple[tuple[str, float], ...] = (
    ("gpu", 0.10),
    ("gpu:2", 0.05),
    ("gpu:8", 0.02),
    ("1g.10gb", 0.18),
    ("2g.20gb", 0.08),
    ("3g.40gb", 0.06),
    ("7g.80gb", 0.01),
    ("vgpu:10Gi/15%", 0.25),
    ("vgpu:20Gi/30%", 0.15),
    ("vgpu:40Gi/50%", 0.10),
)
MEAN_LIFETIME_SECONDS = 3600.0
GPU_MEMORY_GIB = 80


def gpus_of(shape: PodShape) -> float:
    """The share of one 80 GB GPU a pod of this shape holds (memory), for the arrival rate."""
    if shape.kind == "gpu":
        return float(shape.devices)
    if shape.kind == "mig":
        return int(shape.profile.split("g.")[1].split("gb")[0]) / GPU_MEMORY_GIB
    return shape.memory_bytes / (GPU_MEMORY_GIB * 2**30)


def make_trace(gpus: int, seed: int, *, load: float = 1.3, lifetimes: float = 2.0) -> dict[str, Any]:
    """A trace document (what `plan --trace` and the benchmark's --trace read) for a fleet of
    `gpus` GPUs, spanning `lifetimes` mean lifetimes."""
    rng = random.Random(seed)
    kinds = [kind for kind, _ in MIX]
    weights = [weight for _, weight in MIX]
    mean_gpus = sum(gpus_of(parse_shape(kind, kind)) * weight for kind, weight in MIX)
    rate = load * gpus / (mean_gpus * MEAN_LIFETIME_SECONDS)
    end = lifetimes * MEAN_LIFETIME_SECONDS
    arrivals: list[dict[str, Any]] = []
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= end:
            break
        duration = max(1.0, round(rng.expovariate(1 / MEAN_LIFETIME_SECONDS)))
        arrivals.append({"at": round(at, 1), "pod": rng.choices(kinds, weights)[0], "duration": duration})
    return {"arrivals": arrivals}


def seeded_trace(gpus: int, seed: int) -> tuple[str, Trace]:
    """The trace's name and its events, decoded by the same parser `plan --trace` uses."""
    name = f"mixed-{gpus}gpus-seed{seed}"
    return name, parse_trace(make_trace(gpus, seed), name)
