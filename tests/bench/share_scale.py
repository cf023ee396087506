"""Benchmark: vGPU shares at scale, allocated as the scheduler allocates them and then prepared
(issue 48). 2,000 claims of a small share (1Gi and 1 % of the cores) arrive at a DGX H100 whose 8
GPUs are offered by capacity under the default `vgpu.enforcement: mps`; each is allocated by the
allocator model from the node's published devices around those before it, and prepared by the
real claim engine on the simulated GPUs as soon as it is.

Reported for today's slices and for the same slices without the `clients` capacity (what was
published before issue 48): claims allocated, unschedulable, prepared, and refused by prepare
after the scheduler had bound them (the stuck pods), with the first refusal's message. Figures
are counts, not times, so they do not depend on the machine.

Run: `python -m tests.bench.share_scale --output docs/bench/share-scale.json`
"""

import argparse
import time
from pathlib import Path

from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory, build_inventory, node_inventory
from dra_driver.devices.node_config import GpuSettings
from dra_driver.devices.vgpu import MPS_CLIENTS
from dra_driver.packing.planner import shape_claims
from dra_driver.packing.shapes import parse_pods
from tests.bench.report import host, publish
from tests.support.model_claims import allocate_and_prepare
from tests.support.nodes import GIB, every_gpu, simulated_node

PROFILE = "dgx-h100"
SHARE = "vgpu:1Gi/1%"


def _inventory() -> Inventory:
    gpus = simulated_node(PROFILE)
    return node_inventory(gpus, every_gpu(gpus, GpuSettings(mode="vgpu-capacity", memory_step=GIB)))


def _without_clients(inventory: Inventory) -> Inventory:
    """The same devices as published before issue 48: no MPS clients capacity."""
    devices = tuple(
        replace(
            device, capacity={name: value for name, value in device.capacity.items() if name != MPS_CLIENTS}
        )
        for device in inventory.devices
    )
    return replace(
        build_inventory(inventory.plans), devices=devices, device_by_name={d.name: d for d in devices}
    )


def run(shares: int) -> dict[str, object]:
    ((claim),) = shape_claims(parse_pods(SHARE)).values()
    today = _inventory()
    results: dict[str, object] = {}
    for name, inventory in (("today", today), ("without-clients-capacity", _without_clients(today))):
        started = time.perf_counter()
        outcome = allocate_and_prepare(PROFILE, inventory, [(claim, ())] * shares)
        results[name] = {
            "allocated": outcome.allocated,
            "unschedulable": outcome.unschedulable,
            "prepared": outcome.prepared,
            "refused_after_allocation": len(outcome.failures),
            "first_refusal": outcome.failures[0] if outcome.failures else None,
            "seconds": round(time.perf_counter() - started, 1),
        }
    return {
        "benchmark": "share_scale",
        "node": PROFILE,
        "share": SHARE,
        "shares": shares,
        **host(),
        **results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", type=int, default=2000)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    publish(run(args.shares), args.output)


if __name__ == "__main__":
    main()
