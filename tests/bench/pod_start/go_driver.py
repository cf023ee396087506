"""Pod start, our driver beside two Go DRA drivers, on the real local cluster.

Issue 49, part 5; docs/benchmarks.md, "Side by side with the Go drivers".

    python -m tests.bench.pod_start.go_driver --pods 8 --rounds 2 --output docs/bench/go-driver.json

As root. Brings the local cluster up as `make cluster` does unless it is up already, rolls our
agent out as it ships (the chart's DaemonSet pod), and starts beside it, as host processes with 8
devices and a DeviceClass each, upstream's reference driver sigs.k8s.io/dra-example-driver
(`dra-example-kubeletplugin`) and upstream's e2e test driver
k8s.io/kubernetes/test/e2e/dra/test-driver (`dra-test-driver kubelet-plugin`), both built from
their wrapper modules in hack/cluster/modules. Then, per round, one block per driver and pod
size, interleaved (ours, then each Go driver; the order reversed the next round): a pod of 1 and
one of 8 claims started and stopped unrecorded, then `--pods` of them one at a time, each timed
from its create request to Running; kubelet's DRA histograms per driver, the scheduler's attempt
and SLI histograms, and each agent's RSS and CPU seconds read before and after the block. The Go
drivers do almost nothing per claim, ours its full work: see NOTE. The cluster is taken down at
the end if this run brought it up (unless `--keep`).
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.bench.cluster_scale.metrics import SCHEDULER_METRICS, scrape
from tests.bench.pod_start.__main__ import deploy
from tests.bench.pod_start.go_driver_parts import (
    GO_DEVICES,
    GO_DRIVERS,
    NOTE,
    OURS,
    GoDriver,
    Side,
    agent_pid,
    all_ratios,
    order,
    process_figures,
    scheduler_figures,
    scheduler_readings,
    summary,
)
from tests.bench.pod_start.pods import NAMESPACE, Cluster, mean_per_call, refused_start
from tests.bench.pod_start.variants import VARIANTS
from tests.cluster import control_plane, processes
from tests.cluster.build import build
from tests.cluster.layout import Layout
from tests.cluster.teardown import SERVICES, tear_down
from tests.cluster.up import running, up
from tests.cluster.versions import kubernetes_version


def say(message: str) -> None:
    print(f"go driver: {message}", file=sys.stderr, flush=True)


def cluster_is_up(layout: Layout) -> bool:
    """As tests.cluster.up decides it: then this run leaves the cluster up at the end."""
    return (
        layout.environment_file.exists()
        and running(layout) == list(SERVICES[1:])
        and control_plane.api_ready(layout)
    )


def _create(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except client.ApiException as error:
        if error.status != 409:
            raise


def _devices(cluster: Cluster, driver: str) -> int:
    listed = cluster.resource.list_resource_slice(field_selector=f"spec.driver={driver}")
    return sum(len(item.spec.devices or []) for item in listed.items)


def start_go_driver(cluster: Cluster, layout: Layout, go_driver: GoDriver) -> int:
    """A Go driver running, its DeviceClass and template made and its devices published; its pid."""
    binary = build(go_driver.component()) / go_driver.binary
    _create(
        cluster.objects.create_cluster_custom_object,
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        go_driver.class_object(),
    )
    _create(
        cluster.objects.create_namespaced_custom_object,
        "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", go_driver.template(),
    )  # fmt: skip
    processes.stop(layout, go_driver.service)
    for directory in go_driver.premade_dirs(layout):
        directory.mkdir(parents=True, exist_ok=True)
    pid = processes.start(
        layout, go_driver.service, go_driver.argv(binary, layout), go_driver.env(layout, os.environ)
    )
    name = go_driver.side.driver
    processes.wait_until(
        f"{GO_DEVICES} devices of {name} published",
        lambda: _devices(cluster, name) >= GO_DEVICES,
        60, layout, go_driver.service,
    )  # fmt: skip
    return pid


def stop_go_driver(cluster: Cluster, layout: Layout, go_driver: GoDriver) -> None:
    """A Go driver stopped and what it made removed, so a cluster found up is left as it was
    (the helper's Stop leaves its slices; kubelet removes a gone plugin's only after a while)."""
    processes.stop(layout, go_driver.service)
    try:
        cluster.resource.delete_collection_resource_slice(
            field_selector=f"spec.driver={go_driver.side.driver}"
        )
        cluster.resource.delete_device_class(go_driver.device_class)
    except client.ApiException as error:
        if error.status != 404:
            say(f"cleanup of {go_driver.side.key}: {error.status} {error.reason}")


def _scheduler(layout: Layout) -> dict[str, float]:
    return scheduler_readings(asyncio.run(scrape(SCHEDULER_METRICS, layout.pki)))


def measure(
    cluster: Cluster, layout: Layout, side: Side, claims: int, round_index: int, pods: int, pid: int
) -> dict[str, Any]:
    template = side.templates[claims]
    name = f"{side.key}-r{round_index}-{claims}"
    # Unrecorded: the first pod of a block also pays for whatever the other driver left behind.
    cluster.start_pod(f"{name}-warm", template, claims)
    cluster.stop_pod(f"{name}-warm")
    before, dra_before = process_figures(pid), cluster.kubelet_dra_seconds(side.driver)
    scheduler_before = _scheduler(layout)
    seconds = []
    for index in range(pods):
        seconds.append(cluster.start_pod(f"{name}-{index}", template, claims))
        cluster.stop_pod(f"{name}-{index}")
    after, dra_after = process_figures(pid), cluster.kubelet_dra_seconds(side.driver)
    scheduler = scheduler_figures(scheduler_before, _scheduler(layout))
    say(f"{side.key} round {round_index}, {claims} claim(s): p50 {statistics.median(seconds) * 1000:.0f} ms")
    return {
        "driver": side.key,
        "round": round_index,
        "claims": claims,
        "pod_start_s": [round(value, 4) for value in seconds],
        "kubelet_dra": mean_per_call(dra_before, dra_after),
        "scheduler": scheduler,
        "agent": {"pid": pid, "before": before, "after": after},
    }


def _one_agent(timeout: float = 60) -> int:
    """Our agent's pid once the rollout's old pod, if any, has gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return agent_pid()
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def run(
    cluster: Cluster, layout: Layout, pods: int, rounds: int, report: dict[str, Any], output: Path
) -> None:
    pids = {OURS.key: _one_agent()}
    for go_driver in GO_DRIVERS:
        pids[go_driver.side.key] = start_go_driver(cluster, layout, go_driver)
    say("agents: " + ", ".join(f"{key} pid {pid}" for key, pid in pids.items()))
    blocks: list[dict[str, Any]] = []
    for round_index in range(rounds):
        for claims, side in order(round_index):
            blocks.append(measure(cluster, layout, side, claims, round_index, pods, pids[side.key]))
            figures = summary(blocks)
            report.update(summary=figures, ratios_ours_over=all_ratios(figures), blocks=blocks)
            output.write_text(json.dumps(report, indent=1) + "\n")
    if agent_pid() != pids[OURS.key]:
        raise RuntimeError(
            "our agent restarted during the run: its CPU and RSS figures are not one process's"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.pod_start.go_driver", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pods", type=int, default=8, help="recorded pods per block (driver, size, round)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--keep", action="store_true", help="leave a cluster this run brought up")
    args = parser.parse_args(argv)
    if (refused := refused_start("go driver", args.pods, args.rounds)) is not None:
        return refused
    layout, version = Layout.from_environment(), kubernetes_version()
    started = time.monotonic()
    found_up = cluster_is_up(layout)
    say("the cluster is up: it stays up" if found_up else "bringing the cluster up; down at the end")
    up(layout, version)
    cluster = Cluster(str(layout.kubeconfig("admin")))
    try:
        image = deploy(VARIANTS[0], layout, version)
        cluster.set_up()
        report: dict[str, Any] = {
            "kubernetes": version.release,
            "go_drivers": {driver.side.key: driver.source for driver in GO_DRIVERS},
            "our_agent_image": image,
            "pods_per_block": args.pods,
            "rounds": args.rounds,
            "comparable": "claims_1",
            "note": NOTE,
        }
        run(cluster, layout, args.pods, args.rounds, report, args.output)
        report["elapsed_s"] = round(time.monotonic() - started)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        try:
            for go_driver in GO_DRIVERS:
                stop_go_driver(cluster, layout, go_driver)
        finally:
            if not found_up and not args.keep:
                tear_down(layout)
    say(f"done in {time.monotonic() - started:.0f}s: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
