"""Benchmark: discovery of an 8-GPU node by the NVML backend over the mock libnvidia-ml.so.1.

Everything below the mock is real: nvidia-ml-py's ctypes calls, the backend's worker thread, the
MIG queries per profile constant, sysfs reads. Two figures per node:
- cold: a new backend (library lookup under the driver root, nvmlInit reading the node file),
  one discovery, nvmlShutdown: what `inspect` and an agent start pay;
- warm: one more discovery on an initialized backend: what a re-discovery pays.
The mock answers from memory, so this measures the driver's side of the NVML conversation, the
part that the same number of calls costs on a real GPU too (a real driver adds its own time).

Run: `make bench` (or `python -m tests.bench.nvml_discovery --rounds 100`).
"""

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from dra_driver.hardware.nvml import NvmlBackend
from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from tests.bench.device_model import timed
from tests.bench.report import host, publish
from tests.support.mock_nvml import MockNode, make_driver_root

# The heaviest 8-GPU nodes: every MIG profile and placement asked for on every GPU, and MIG
# instances to read on top.
PROFILES = ("b200x8-mig", "dgx-h100", "mixed")


def discover_cold(node: MockNode, driver_root: Path) -> None:
    async def once() -> None:
        backend = NvmlBackend(node.pci_devices, driver_root)
        gpus = await backend.discover()
        assert len(gpus) == 8
        await backend.close()

    asyncio.run(once())


def measure(directory: Path, driver_root: Path, profile: str, rounds: int) -> dict[str, Any]:
    node = MockNode.create(directory / profile, "node-a", profile)
    os.environ.update(node.environment())
    os.environ.pop("MOCK_NVML_CALLS", None)
    cold = timed(lambda: discover_cold(node, driver_root), rounds)

    async def warm_rounds() -> dict[str, float]:
        backend = NvmlBackend(node.pci_devices, driver_root)
        await backend.discover()
        loop = asyncio.get_running_loop()
        samples = []
        for _ in range(rounds):
            started = loop.time()
            await backend.discover()
            samples.append(loop.time() - started)
        await backend.close()
        ordered = sorted(samples)
        return {"p50_ms": ordered[len(ordered) // 2] * 1e3, "max_ms": ordered[-1] * 1e3}

    return {"profile": profile, "cold": cold, "warm": asyncio.run(warm_rounds())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        driver_root = make_driver_root(directory / "driver", DEFAULT_DRIVER_VERSION)
        results = {
            "what": "NVML backend discovery of 8 GPUs over the mock libnvidia-ml.so.1",
            **host(),
            "rounds": args.rounds,
            "nodes": [measure(directory, driver_root, profile, args.rounds) for profile in PROFILES],
        }
    publish(results, args.output)


if __name__ == "__main__":
    main()
