"""Seeded request traces with churn, for the packing benchmark and the planner.

A trace is a list of arrivals and departures of one-device claims on one node. Arrivals come as
a Poisson process whose rate offers `load` times the node's GPU memory on average (so the node
runs full and refuses some claims); each claim stays for an exponential lifetime (mean 1 hour).
A refused claim never departs. The same mix, seed and node always give the same trace.

The mixes, and why (numbers are the share of arrivals):
- MIG (`mig_mix`): inference-heavy, the way MIG is mostly used: many small instances and a few
  large ones. 1g (one memory slice) 45 %, 1g with two memory slices 10 %, 2g 15 %, 3g 15 %,
  4g 8 %, 7g 7 %. The big ones are what fragmentation starves.
- vGPU partitions (`partition_mix`): inference shares of 5, 10 and 20 GiB (40 / 35 / 20 %) and
  5 % whole GPUs, on a node publishing those three partition sizes.
- vGPU capacity (`capacity_mix`): shares of 5 to 20 GiB (uniform, whole GiB) with the matching
  fraction of the SMs (`cores`, rounded up), and 5 % whole GPUs (a claim that names no
  capacity gets the defaults, which are the whole GPU).
"""

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from dra_driver.devices.model import Device
from dra_driver.hardware.model import Gpu, MigProfile
from dra_driver.packing.allocator import Claim, Request, Selector
from dra_driver.packing.live import AttributeIs

GIB = 2**30
MEAN_LIFETIME_HOURS = 1.0


@dataclass(frozen=True, slots=True)
class Shape:
    """What one claim asks for (one device), and the GPU memory it takes when admitted."""

    label: str
    claim: Claim
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class Mix:
    name: str
    shapes: tuple[tuple[Shape, float], ...]


@dataclass(frozen=True, slots=True)
class Event:
    """An arrival (`shape` set) or the departure of claim `claim_id` (`shape` None), at `hours`."""

    hours: float
    claim_id: int
    shape: Shape | None


@cache
def _profile_selector(profile_name: str) -> AttributeIs:
    return AttributeIs("profile", profile_name)


@dataclass(frozen=True, slots=True)
class _PartitionOf:
    memory_bytes: int

    def __call__(self, device: Device) -> bool:
        memory = device.capacity.get("memory")
        return device.type == "vgpu" and memory is not None and memory.value == self.memory_bytes


def attribute_is(attribute: str, value: str) -> Selector:
    """A hashable selector: the device's attribute equals `value`."""
    return AttributeIs(attribute, value)


def partition_of(memory_bytes: int) -> Selector:
    """A hashable selector: a vGPU partition of exactly this much memory."""
    return _PartitionOf(memory_bytes)


def _one(label: str, request: Request, memory_bytes: int) -> Shape:
    return Shape(label, Claim((request,)), memory_bytes)


def mig_shapes(gpu: Gpu) -> Mapping[str, Shape]:
    """One shape per MIG profile without media-engine variants, keyed by size class:
    '1g', '1g-2slice', '2g', '3g', '4g', '7g'."""
    shapes = {}
    plain = [profile for profile in gpu.mig_profiles if "+" not in profile.name and "-" not in profile.name]
    for profile in plain:
        size = profile.placements[0].size if profile.placements else 0
        key = f"{profile.compute_slices}g" + ("-2slice" if profile.compute_slices == 1 and size == 2 else "")
        shapes[key] = _mig_shape(profile)
    return shapes


def _mig_shape(profile: MigProfile) -> Shape:
    request = Request("mig", selector=_profile_selector(profile.name))
    return _one(profile.name, request, profile.memory_bytes)


MIG_WEIGHTS = {"1g": 45, "1g-2slice": 10, "2g": 15, "3g": 15, "4g": 8, "7g": 7}
PARTITION_SIZES_GIB = (5, 10, 20)
PARTITION_WEIGHTS = {5: 40, 10: 35, 20: 20}
WHOLE_GPU_WEIGHT = 5


def mig_mix(gpu: Gpu) -> Mix:
    shapes = mig_shapes(gpu)
    return Mix("mig", tuple((shapes[key], weight) for key, weight in MIG_WEIGHTS.items() if key in shapes))


def whole_gpu_shape(gpu: Gpu) -> Shape:
    return _one("gpu", Request("gpu", selector=AttributeIs("type", "gpu")), gpu.memory_bytes)


def partition_mix(gpu: Gpu) -> Mix:
    shapes = [
        (_one(f"vgpu {size}Gi", Request("vgpu", selector=_PartitionOf(size * GIB)), size * GIB), weight)
        for size, weight in PARTITION_WEIGHTS.items()
    ]
    return Mix("vgpu-partitions", (*shapes, (whole_gpu_shape(gpu), WHOLE_GPU_WEIGHT)))


def capacity_mix(gpu: Gpu) -> Mix:
    shared = AttributeIs("type", "vgpu")
    shares = []
    for gib in range(5, 21):
        cores = math.ceil(100 * gib * GIB / gpu.memory_bytes)
        request = Request("vgpu", selector=shared, capacity={"memory": gib * GIB, "cores": cores})
        shares.append((_one(f"share {gib}Gi/{cores}%", request, gib * GIB), 95 / 16))
    whole = _one("gpu", Request("vgpu", selector=shared), gpu.memory_bytes)
    return Mix("vgpu-capacity", (*shares, (whole, WHOLE_GPU_WEIGHT)))


def make_trace(
    mix: Mix, node_memory_bytes: int, arrivals: int, seed: int, load: float = 1.3
) -> tuple[Event, ...]:
    """`arrivals` claims; `load`: offered GPU memory over the node's (1.0 = full on average)."""
    rng = random.Random(seed)
    shapes = [shape for shape, _ in mix.shapes]
    weights = [weight for _, weight in mix.shapes]
    mean_memory = sum(shape.memory_bytes * weight for shape, weight in mix.shapes) / sum(weights)
    rate = load * node_memory_bytes / (mean_memory * MEAN_LIFETIME_HOURS)
    events = []
    now = 0.0
    for claim_id in range(arrivals):
        now += rng.expovariate(rate)
        shape = rng.choices(shapes, weights)[0]
        events.append(Event(now, claim_id, shape))
        events.append(Event(now + rng.expovariate(1 / MEAN_LIFETIME_HOURS), claim_id, None))
    # Departures before arrivals at equal times; claim ids keep the order total.
    return tuple(sorted(events, key=lambda event: (event.hours, event.shape is not None, event.claim_id)))


def trace_hours(events: Sequence[Event]) -> float:
    return max((event.hours for event in events if event.shape is not None), default=0.0)
