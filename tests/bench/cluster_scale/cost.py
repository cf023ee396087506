"""Part 4: what our slices cost the scheduler. Per fleet size and slice shape, `pods_per_node`
pods a node are created at once and the scheduler binds them; throughput is pods over the time
from the first created to the last bound, and the scheduler's own histograms give the scheduling
latency (pod_scheduling_sli_duration: first attempt to bound) and one attempt's time.

The baseline is the simplest slices a driver can publish, one device per GPU with no attribute,
capacity or counter (what scheduler_perf's test driver publishes), from another driver on the same
nodes, in the same run: the ratio of ours to it is our cost, whatever the machine.
"""

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.bench.cluster_scale import cluster_objects, objects
from tests.bench.cluster_scale.api import CORE, RESOURCE, Api
from tests.bench.cluster_scale.fleet import fleet_nodes, node_name
from tests.bench.cluster_scale.harness import say
from tests.bench.cluster_scale.metrics import SCHEDULER_METRICS, delta, quantile, scrape, total
from tests.bench.cluster_scale.needs import GIB, Need
from tests.bench.cluster_scale.publish import publishing

SIMPLE_DRIVER = "simple.bench.dra-driver.dev"
GPUS_PER_NODE = 8
# shape -> (fleet, what each pod asks for)
SHAPES: dict[str, tuple[str, Need]] = {
    "whole GPU": ("whole", Need("gpu")),
    "MIG 1g.10gb": ("mig-dynamic", Need("mig", profile="1g.10gb")),
    "vGPU share 10Gi/15%": ("vgpu-capacity", Need("vgpu", memory_bytes=10 * GIB, cores=15)),
    "vGPU partition 10Gi": ("vgpu-partitions", Need("vgpu", memory_bytes=10 * GIB, cores=15)),
}
SLI = "scheduler_pod_scheduling_sli_duration_seconds"
ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
CREATE_CONCURRENCY = 32


def simple_slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-simple"},
        "spec": {
            "driver": SIMPLE_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{index}"} for index in range(GPUS_PER_NODE)],
        },
    }


def simple_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": SIMPLE_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{SIMPLE_DRIVER}"'}}]},
    }


def _template(name: str) -> dict[str, Any]:
    request = {"name": "devices", "exactly": {"deviceClassName": SIMPLE_DRIVER}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


async def _bound(api: Api, namespace: str) -> int:
    found = await api.get(f"{CORE}/namespaces/{namespace}/pods?fieldSelector=spec.nodeName%21%3D")
    return len((found or {}).get("items", []))


async def _burst(api: Api, pki: Path, namespace: str, template: str, pods: int) -> dict[str, Any]:
    """Creates `pods` pods at once (no gate) and times them until all are bound."""
    before = await scrape(SCHEDULER_METRICS, pki)
    started = time.monotonic()
    bodies = []
    for index in range(pods):
        body = objects.pod(f"c{index:05d}", template)
        del body["spec"]["schedulingGates"]
        bodies.append(body)
    for first in range(0, pods, CREATE_CONCURRENCY):
        await asyncio.gather(
            *(
                api.create(f"{CORE}/namespaces/{namespace}/pods", body)
                for body in bodies[first : first + CREATE_CONCURRENCY]
            )
        )
    created = time.monotonic() - started
    await cluster_objects.wait_for(f"{pods} pods bound", lambda: _all_bound(api, namespace, pods), 900)
    elapsed = time.monotonic() - started
    after = delta(await scrape(SCHEDULER_METRICS, pki), before)
    sli = {f"p{int(q * 100)}": quantile(after, SLI, q) for q in (0.5, 0.99)}
    attempt = {f"p{int(q * 100)}": quantile(after, ATTEMPT, q, result="scheduled") for q in (0.5, 0.99)}
    return {
        "pods": pods,
        "pods_per_second": round(pods / elapsed, 1),
        "create_seconds": round(created, 2),
        "bound_seconds": round(elapsed, 2),
        "sli_ms": {k: None if v is None else round(v * 1000, 1) for k, v in sli.items()},
        "attempt_ms": {k: None if v is None else round(v * 1000, 2) for k, v in attempt.items()},
        "attempts": total(after, "scheduler_schedule_attempts_total"),
        "unschedulable_attempts": total(after, "scheduler_schedule_attempts_total", result="unschedulable"),
    }


async def _all_bound(api: Api, namespace: str, pods: int) -> bool:
    return await _bound(api, namespace) >= pods


async def measure(
    api: Api, kubeconfig: Path, pki: Path, nodes: int, pods_per_node: int, run: int
) -> list[dict[str, Any]]:
    """One row per slice shape at this fleet size, the simplest slices first."""
    rows = []
    pods = nodes * pods_per_node
    await cluster_objects.clear_slices(api)
    namespace = f"cost-{run}"
    for node in range(nodes):
        await api.create(f"{RESOURCE}/resourceslices", simple_slice(node_name(node)))
    await api.create(f"{CORE}/namespaces", objects.namespace(namespace))
    await cluster_objects.make_namespace_ready(api, namespace)
    await api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", _template("simple"))
    await asyncio.sleep(2)  # the scheduler's informers see the slices
    row = await _burst(api, pki, namespace, "simple", pods)
    rows.append({"nodes": nodes, "shape": "simplest (1 device per GPU, no attributes)", **row})
    say(f"cost at {nodes} nodes, simplest slices: {row['pods_per_second']} pods/s")
    await cluster_objects.drop_namespace(api, namespace)
    await api.delete(f"{RESOURCE}/resourceslices", (("fieldSelector", f"spec.driver={SIMPLE_DRIVER}"),))
    for index, (shape, (fleet, need)) in enumerate(SHAPES.items()):
        fleet_of = fleet_nodes(fleet, nodes, "binpack", [need])
        await cluster_objects.clear_slices(api)
        async with publishing(kubeconfig, fleet_of) as publishers:
            await publishers.converged()
            namespace = f"cost-{run}-{index}"
            templates = await cluster_objects.make_namespace(api, namespace, [need])
            await asyncio.sleep(2)
            row = await _burst(api, pki, namespace, templates[need], pods)
            rows.append({"nodes": nodes, "shape": shape, **row})
            say(f"cost at {nodes} nodes, {shape}: {row['pods_per_second']} pods/s")
            await cluster_objects.drop_namespace(api, namespace)
    baseline = rows[0]["pods_per_second"]
    for row in rows:
        row["throughput_vs_simplest"] = round(row["pods_per_second"] / baseline, 3) if baseline else None
    return rows
