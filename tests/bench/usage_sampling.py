"""Benchmark: one GPU usage sample of an 8-GPU node with 64 processes in 64 pods, the whole path.

Everything is real but the GPUs: NVML calls through nvidia-ml-py into the mock libnvidia-ml.so.1
(memory, utilisation, running processes and per-process samples of each GPU), kubelet's
PodResources List over gRPC on a unix socket (a stand-in kubelet with 64 pods), 64 cgroup files
read and 64 pod log directories listed, the join with 64 prepared claim records (8 vGPU shares
per GPU), and the metrics published. Figures:
- CPU seconds per sample (process time, the sampler's thread being the only one busy), and what
  that is as a share of one core at the default interval (10 s);
- resident memory the sampler adds: before it exists, after its first sample, and after all
  rounds (growth would be a leak).

Run: `make bench` (or `python -m tests.bench.usage_sampling --rounds 200`). With `--agent`, the
same workload against the running agent instead (tests/bench/usage_agent.py).
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import ClaimRecord, PreparedDevice
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.hardware.model import Gpu
from dra_driver.hardware.nvml_library import load_nvml_library
from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from dra_driver.observability.usage_metrics import UsageMetrics
from dra_driver.usage.facts import device_facts
from tests.bench.report import host, publish
from tests.support.mock_nvml import MockNode, make_driver_root
from tests.support.nodes import simulated_node
from tests.support.pod_resources import Pod, UsedDevice

PROFILE = "dgx-h100"
DRIVER = "gpu.dra-driver.dev"
POOL = "node-a"
SHARES_PER_GPU = 8
GIB = 2**30
INTERVAL = 10.0


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@dataclass(frozen=True)
class Share:
    """One vGPU share of the workload: its claim, its pod and the one process it runs."""

    gpu_index: int
    device: str
    name: str
    pid: int
    pod_uid: str
    share_id: str
    memory_bytes: int
    sm_percent: int


def workload(gpus: Sequence[Gpu]) -> list[Share]:
    """SHARES_PER_GPU shares of every GPU, each with fresh UIDs."""
    return [
        Share(
            gpu.index,
            f"gpu-{gpu.minor}",
            f"g{gpu.index}-s{share}",
            10_000 + gpu.index * 100 + share,
            str(uuid.uuid4()),
            str(uuid.uuid4()),
            (share + 1) * GIB,
            5 + share,
        )
        for gpu in gpus
        for share in range(SHARES_PER_GPU)
    ]


def run_workload(node: MockNode, shares: Sequence[Share], pool: str, pod_logs: Path) -> list[Pod]:
    """Makes the mock NVML report every share's process (memory, SM samples), gives each process a
    cgroup file naming its pod (systemd driver layout) and each pod its kubelet log directory;
    returns the pods for the stand-in kubelet."""
    pods = []
    for share in shares:
        pods.append(
            Pod(
                "team",
                f"pod-{share.name}",
                [UsedDevice("main", share.name, DRIVER, pool, share.device, share.share_id)],
            )
        )
        (pod_logs / f"team_pod-{share.name}_{share.pod_uid}" / "main").mkdir(parents=True)
        process = node.proc / str(share.pid)
        process.mkdir(parents=True)
        slice_name = f"kubepods-besteffort-pod{share.pod_uid.replace('-', '_')}.slice"
        (process / "cgroup").write_text(f"0::/kubepods.slice/{slice_name}/cri-containerd-{'c' * 64}.scope\n")
    node.run_processes([(s.gpu_index, -1, -1, s.pid, s.memory_bytes) for s in shares])
    node.set_process_utilization([(s.gpu_index, s.pid, s.sm_percent) for s in shares])
    node.set_utilization({s.gpu_index: 70 for s in shares})
    return pods


def setup(directory: Path) -> tuple[MockNode, list[ClaimRecord], list[Pod], Path]:
    node = MockNode.create(directory / "mock", POOL, PROFILE)
    shares = workload(simulated_node(PROFILE, POOL))
    pod_logs = directory / "pods"
    pods = run_workload(node, shares, POOL, pod_logs)
    records = [
        ClaimRecord(
            claim=claim_ref("team", share.name, str(uuid.uuid4())),
            devices=(
                PreparedDevice(
                    ("v",),
                    POOL,
                    share.device,
                    (f"k8s.{DRIVER}/claim={share.name}",),
                    share_id=share.share_id,
                    memory_limit_bytes=8 * GIB,
                    cores_limit=12,
                ),
            ),
        )
        for share in shares
    ]
    return node, records, pods, pod_logs


def measure(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir="/tmp") as temporary:
        directory = Path(temporary)
        node, records, pods, pod_logs = setup(directory)
        os.environ.update(node.environment())
        driver_root = make_driver_root(directory / "driver", DEFAULT_DRIVER_VERSION)
        config = parse_node_config(yaml.safe_load("default: {mode: vgpu-capacity}\n"), "bench")
        facts = device_facts(node_inventory(simulated_node(PROFILE, POOL), config))
        gpus = simulated_node(PROFILE, POOL)
        socket = directory / "pr.sock"
        pods_file = directory / "pods.json"
        pods_file.write_text(json.dumps([dataclasses.asdict(pod) for pod in pods]))
        # The stand-in kubelet in a process of its own, as kubelet is: its memory is not ours.
        with subprocess.Popen(
            [sys.executable, "-m", "tests.support.pod_resources", str(socket), str(pods_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as kubelet:
            assert kubelet.stdout is not None and kubelet.stdout.readline().strip() == "serving"
            # Everything the agent has loaded anyway (grpc, pynvml, prometheus_client) is imported
            # above; what follows is what turning the sampler on adds.
            from dra_driver.hardware.nvml_usage import NvmlUsageReader  # noqa: PLC0415
            from dra_driver.usage.pod_resources import PodResourcesClient  # noqa: PLC0415
            from dra_driver.usage.sampler import UsageSources, sample  # noqa: PLC0415

            # The agent's NVML backend has the library loaded and initialized already.
            load_nvml_library(driver_root)
            pynvml.nvmlInit()
            rss_before = rss_kib()
            registry = CollectorRegistry()
            metrics = UsageMetrics(registry)
            sources = UsageSources(
                reader=NvmlUsageReader(driver_root),
                driver_name=DRIVER,
                claims=lambda: records,
                facts=lambda: facts,
                gpus=lambda: gpus,
                pod_resources=PodResourcesClient(socket),
                proc_root=node.proc,
                pod_logs_dir=pod_logs,
            )
            report = sample(sources, metrics)
            assert len(report.claims) == len(records) and all(r.memory_used_bytes for r in report.claims)
            rss_first = rss_kib()
            cpu, wall, rss_at = [], [], {}
            for round_number in range(1, rounds + 1):
                started_cpu, started_wall = time.process_time(), time.perf_counter()
                sample(sources, metrics)
                cpu.append(time.process_time() - started_cpu)
                wall.append(time.perf_counter() - started_wall)
                if round_number in (100, 1000, 3000):
                    rss_at[round_number] = rss_kib()
            scrape = len(generate_latest(registry))
            rss_after = rss_kib()
            sources.reader.close()
            pynvml.nvmlShutdown()
            assert kubelet.stdin is not None
            kubelet.stdin.close()
    cpu.sort()
    wall.sort()
    p50_cpu = cpu[len(cpu) // 2]
    return {
        "gpus": len(gpus),
        "processes": len(records),
        "claims": len(records),
        "pods": len(pods),
        "cpu_ms_per_sample": {"p50": p50_cpu * 1e3, "p90": cpu[len(cpu) * 9 // 10] * 1e3},
        "wall_ms_per_sample": {"p50": wall[len(wall) // 2] * 1e3, "max": wall[-1] * 1e3},
        "share_of_one_core_at_10s": p50_cpu / INTERVAL,
        "rss_kib": {
            "before": rss_before,
            "after_first_sample": rss_first,
            **{f"after_{n}_samples": kib for n, kib in rss_at.items()},
            "after_all": rss_after,
        },
        "rss_added_kib": rss_after - rss_before,
        "metrics_bytes_per_scrape": scrape,
        "note": "the stand-in kubelet runs in a process of its own; RSS is measured with NVML "
        "already loaded and initialized, as the agent's backend has it",
    }


def main() -> None:
    if "--agent" in sys.argv[1:]:
        from tests.bench import usage_agent  # noqa: PLC0415 - the agent-level variant of this bench

        usage_agent.main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--agent", action="store_true", help="measure the running agent instead (tests/bench/usage_agent.py)"
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    results = {
        "what": f"one usage sample: {PROFILE} (8 GPUs), 64 processes in 64 pods, 64 vGPU-share claims",
        **host(),
        "rounds": args.rounds,
        "result": measure(args.rounds),
    }
    publish(results, args.output)


if __name__ == "__main__":
    main()
