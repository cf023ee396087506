"""Benchmark: what GPU usage sampling costs the running node agent, with the whole join to do.

`tests/bench/usage_sampling.py` measures one sample in-process; `tests/bench/memory.py` measured
the agent with usage on but nothing to join (no kubelet socket, no processes). Here the agent is
the real `dra-driver node --hardware nvml` on the mock libnvidia-ml.so.1 (a dgx-h100: 8 GPUs, in
vGPU capacity mode), as its image runs it, with:
- 64 vGPU-share claims (8 per GPU) allocated on the stand-in API server and prepared through the
  agent's DRA socket, so its records hold them;
- the stand-in kubelet's PodResources server (a process of its own) serving the 64 pods that use
  them;
- 64 processes the mock NVML reports (memory and SM samples), each with a cgroup file under
  --proc-root naming its pod and a pod log directory under --pod-logs-dir (`--usage-processes true`).

Each variant is a fresh agent with one `--usage-interval` (0: usage off, the baseline). After
the claims are prepared and (usage on) a first sample shows all 64 claims with their memory, the
agent's RSS and CPU time are read ("warm"); then again every `--every` s for `--duration` s.
CPU per sample is the agent's CPU over that window less the baseline's over its window, divided
by the samples taken (the window over the interval plus the last sample's own duration).

Run: `python -m tests.bench.usage_sampling --agent --duration 120 --output
docs/bench/usage-agent-join.json` (which calls `main` here).
"""

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg, register
from tests.bench.memory import process_status, smaps_breakdown
from tests.bench.prepare_latency import cpu_seconds
from tests.bench.standin import bench_workspace
from tests.bench.usage_sampling import DRIVER, PROFILE, Share, run_workload, workload
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate_results
from tests.support.image import IMAGE_ENVIRONMENT, compile_like_the_image
from tests.support.mock_nvml import MockNode, make_driver_root
from tests.support.nodes import simulated_node
from tests.support.waiting import wait_until

NODE_CONFIG = "default: {mode: vgpu-capacity}\n"
DEFAULT_INTERVALS = (0.0, 10.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Node:
    """Everything the variants share: the mock GPUs with their processes, the pods, the kubelet."""

    mock: MockNode
    driver_root: Path
    node_config: Path
    pod_logs: Path
    pod_resources_socket: Path
    shares: Sequence[Share]
    # On top of the image's environment, for every agent (`--env`, e.g. MALLOC_ARENA_MAX=1).
    env: Mapping[str, str]
    # `--usage-processes`: off, the sample reads no cgroups and shared devices' splits are unknown.
    usage_processes: bool


def scrape(agent: AgentProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(agent.metrics_text())
    }


def claims_measured(agent: AgentProcess, processes: bool) -> int:
    """Claims the last sample joined with their pod and (processes attributed) their process's memory;
    without processes a shared device's memory is unknown, and the row has the pod and limits only."""
    metric = "dra_driver_claim_memory_used_bytes" if processes else "dra_driver_claim_memory_limit_bytes"
    rows = scrape(agent).get(metric, [])
    return sum(1 for labels, value in rows if labels.get("pod") and value > 0)


def wait_for_join(agent: AgentProcess, claims: int, interval: float, processes: bool) -> None:
    """Until a sample shows every claim just prepared joined (`claims_measured`)."""
    try:
        wait_until(lambda: claims_measured(agent, processes) == claims, timeout=interval + 30, interval=0.2)
    except AssertionError:
        families = scrape(agent)
        rows = families.get("dra_driver_claim_memory_used_bytes", [])
        failures = families.get("dra_driver_usage_sample_errors", [])
        raise AssertionError(
            f"the join is incomplete: {rows[:4]} of {len(rows)}; errors {failures}"
        ) from None


def gauge(agent: AgentProcess, name: str) -> float:
    rows = scrape(agent).get(name, [])
    return rows[0][1] if rows else 0.0


@contextmanager
def stand_in_kubelet(node: Node, pods_file: Path) -> Iterator[None]:
    """The PodResources stand-in in a process of its own, as kubelet is: its memory is not the agent's."""
    with subprocess.Popen(
        [sys.executable, "-m", "tests.support.pod_resources", str(node.pod_resources_socket), str(pods_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as kubelet:
        assert kubelet.stdout is not None and kubelet.stdout.readline().strip() == "serving"
        try:
            yield
        finally:
            assert kubelet.stdin is not None
            kubelet.stdin.close()


def add_node(kubeconfig: Path) -> None:
    """The Node the agent's ResourceSlices are owned by, so that it publishes as on a cluster."""
    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        client.CoreV1Api(api_client).create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME}}
        )
    finally:
        api_client.close()


def allocate_all(kubeconfig: Path, shares: Sequence[Share]) -> list[ClaimArg]:
    """The shares' claims, allocated on the stand-in as the scheduler would (named as the pods
    of the stand-in kubelet name them)."""
    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        api = client.ResourceV1Api(api_client)
        claims = []
        for share in shares:
            result = {
                "request": "v",
                "driver": DRIVER,
                "pool": NODE_NAME,
                "device": share.device,
                "shareID": share.share_id,
                "consumedCapacity": {"memory": "8Gi", "cores": "12"},
            }
            uid = allocate_results(api, share.name, [result], namespace="team")
            claims.append(ClaimArg("team", share.name, uid))
    finally:
        api_client.close()
    return claims


def delete_all(kubeconfig: Path, claims: Sequence[ClaimArg]) -> None:
    """Frees the names for the next variant's agent (whose records start empty)."""
    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        api = client.ResourceV1Api(api_client)
        for claim in claims:
            api.delete_namespaced_resource_claim(claim.name, claim.namespace)
    finally:
        api_client.close()


def start(work: Path, kubeconfig: Path, node: Node, interval: float, cdi_dir: Path) -> AgentProcess:
    extra = (
        *("--driver-root", str(node.driver_root), "--sysfs-root", str(node.mock.sysfs)),
        *("--proc-root", str(node.mock.proc), "--node-config", str(node.node_config)),
        *("--cdi-dir", str(cdi_dir), "--usage-interval", f"{interval:g}"),
        *("--pod-resources-socket", str(node.pod_resources_socket)),
        *("--usage-processes", str(node.usage_processes).lower(), "--pod-logs-dir", str(node.pod_logs)),
    )
    env = {**IMAGE_ENVIRONMENT, **node.mock.environment(), **node.env}
    return start_agent(AgentDirs(root=work), kubeconfig, "nvml", extra, wait=False, env=env)


def run_variant(
    work: Path, kubeconfig: Path, node: Node, interval: float, duration: float, every: float
) -> dict[str, Any]:
    name = f"i{interval:g}".replace(".", "p")
    claims = allocate_all(kubeconfig, node.shares)
    cdi_dir = Path(tempfile.mkdtemp(prefix="dra-bench-cdi-", dir="/dev/shm"))
    agent = start(work / name, kubeconfig, node, interval, cdi_dir)
    try:
        wait_until(agent.dirs.registration_socket.exists, timeout=60, interval=0.01)
        asyncio.run(register(agent.dirs.registration_socket))
        registered = process_status(agent.process.pid)
        answers = asyncio.run(kubelet_client.prepare(agent.dirs.dra_socket, "v1", claims))["claims"]
        errors = {answer["error"] for answer in answers.values()} - {""}
        assert not errors, f"prepare failed: {sorted(errors)[:3]}"
        if interval > 0:
            wait_for_join(agent, len(claims), interval, node.usage_processes)
        else:
            scrape(agent)  # the same one scrape as the others, so that the baseline carries it too
        pid = agent.process.pid
        warm, cpu_warm, started = process_status(pid), cpu_seconds(pid), time.monotonic()
        series = []
        while (elapsed := time.monotonic() - started) < duration:
            time.sleep(min(every, duration - elapsed))
            series.append((round(time.monotonic() - started, 1), process_status(pid)["VmRSS_mib"]))
        window, cpu = time.monotonic() - started, cpu_seconds(pid) - cpu_warm
        after, smaps = process_status(pid), smaps_breakdown(pid)
        last_duration = gauge(agent, "dra_driver_usage_sample_duration_seconds") if interval > 0 else 0.0
        measured = claims_measured(agent, node.usage_processes) if interval > 0 else 0
    finally:
        agent.terminate(timeout=30)
        shutil.rmtree(cdi_dir, ignore_errors=True)
        delete_all(kubeconfig, claims)
    return {
        "interval_s": interval,
        "registered": registered,
        "warm": warm,
        "after": after,
        "after_smaps_anonymous_mib": smaps["anonymous_mib"],
        "rss_series_mib": series,
        "window_s": round(window, 2),
        "cpu_s_in_window": round(cpu, 3),
        "samples_in_window": round(window / (interval + last_duration)) if interval > 0 else 0,
        "last_sample_ms": round(last_duration * 1e3, 2),
        "claims_measured_at_end": measured,
    }


def summarise(variants: list[dict[str, Any]]) -> dict[str, Any]:
    """Each usage-on variant against the baseline (interval 0) of the same run."""
    (baseline,) = [v for v in variants if v["interval_s"] == 0]
    idle_cpu_per_s = baseline["cpu_s_in_window"] / baseline["window_s"]
    summary = {}
    for variant in variants:
        if variant["interval_s"] == 0:
            continue
        extra_cpu = variant["cpu_s_in_window"] - idle_cpu_per_s * variant["window_s"]
        samples = variant["samples_in_window"]
        summary[f"{variant['interval_s']:g}s"] = {
            "rss_added_mib_warm": round(variant["warm"]["VmRSS_mib"] - baseline["warm"]["VmRSS_mib"], 2),
            "rss_added_mib_after": round(variant["after"]["VmRSS_mib"] - baseline["after"]["VmRSS_mib"], 2),
            "rss_growth_mib_in_window": round(
                variant["after"]["VmRSS_mib"] - variant["warm"]["VmRSS_mib"], 2
            ),
            "samples_in_window": samples,
            "cpu_ms_per_sample": round(extra_cpu * 1e3 / samples, 2) if samples else None,
            "share_of_one_core": round(extra_cpu / variant["window_s"], 5),
        }
    return summary


def line(figures: dict[str, Any]) -> str:
    return (
        f"interval {figures['interval_s']:g}: warm {figures['warm']['VmRSS_mib']:.2f} MiB, "
        f"after {figures['after']['VmRSS_mib']:.2f} MiB, CPU {figures['cpu_s_in_window']:.2f} s "
        f"in {figures['window_s']:.0f} s, {figures['samples_in_window']} samples"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--intervals", type=lambda t: [float(x) for x in t.split(",")], default=DEFAULT_INTERVALS
    )
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured after warm-up")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between RSS readings")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every agent")
    parser.add_argument(
        "--no-processes", dest="processes", action="store_false", help="--usage-processes false"
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    intervals = [0.0, *(i for i in args.intervals if i > 0)]
    results: dict[str, Any] = {
        "what": f"the agent on the mock NVML ({PROFILE}, 8 GPUs): 64 vGPU-share claims prepared, 64 pods "
        "in the stand-in kubelet, 64 processes attributed by cgroup; usage off (0) against each interval",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "duration_s": args.duration,
        "agent_env": dict(assignment.split("=", 1) for assignment in args.env),
        "usage_processes": args.processes,
        "runs": [],
    }
    compile_like_the_image()
    with bench_workspace() as (work, kubeconfig):
        mock = MockNode.create(work / "mock", NODE_NAME, PROFILE)
        shares = workload(simulated_node(PROFILE, NODE_NAME))
        node = Node(
            mock=mock,
            driver_root=make_driver_root(work / "driver", DEFAULT_DRIVER_VERSION),
            node_config=work / "node-config.yaml",
            pod_logs=work / "pods",
            pod_resources_socket=work / "pr.sock",
            shares=shares,
            env=results["agent_env"],
            usage_processes=args.processes,
        )
        node.node_config.write_text(NODE_CONFIG)
        add_node(kubeconfig)
        pods = run_workload(mock, shares, NODE_NAME, node.pod_logs)
        pods_file = work / "pods.json"
        pods_file.write_text(json.dumps([dataclasses.asdict(pod) for pod in pods]))
        with stand_in_kubelet(node, pods_file):
            for run in range(args.runs):
                variants = []
                for interval in intervals:
                    figures = run_variant(
                        work / f"r{run}", kubeconfig, node, interval, args.duration, args.every
                    )
                    variants.append(figures)
                    print(f"run {run + 1}: {line(figures)}", flush=True)
                results["runs"].append({"variants": variants, "summary": summarise(variants)})
                print(json.dumps(results["runs"][-1]["summary"], indent=2), flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
