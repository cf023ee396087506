"""Part 4: what our slices cost the scheduler. Per fleet size and slice shape, `pods_per_node`
pods a node are created at once and the scheduler binds them; throughput is pods over the time
from the first created to the last bound, and the scheduler's own histograms give the scheduling
latency (pod_scheduling_sli_duration: first attempt to bound) and one attempt's time.

The baseline is the simplest slices a driver can publish, one device per GPU with no attribute,
capacity or counter (what scheduler_perf's test driver publishes), from another driver on the same
nodes, in the same run, just before each shape: the ratio of ours to it is our cost, whatever
the machine and whatever else runs on it.

A shape is one command-line choice (`--cost-shapes`, keys of SHAPES and SPLIT_SHAPES): the modes
as they ship, dynamic MIG with a node config's `mig.profiles` (what an operator can choose to
publish fewer placements), and diagnostic shapes the driver cannot publish: placements stripped
of their attributes and capacities, which tells the cost of a device's entries from the cost of
its count, and the simplest devices split over more slices, which tells a slice's cost.
"""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from dra_driver.devices import attributes as names
from dra_driver.devices.model import Device
from tests.bench.cluster_scale import cluster_objects, objects
from tests.bench.cluster_scale.api import CORE, RESOURCE, Api
from tests.bench.cluster_scale.fleet import FleetNode, fleet_nodes, node_name
from tests.bench.cluster_scale.harness import say
from tests.bench.cluster_scale.metrics import SCHEDULER_METRICS, Samples, delta, quantile, scrape, total
from tests.bench.cluster_scale.needs import GIB, Need
from tests.bench.cluster_scale.publish import publishing

SIMPLE_DRIVER = "simple.bench.dra-driver.dev"
GPUS_PER_NODE = 8


class CostShape(msgspec.Struct, frozen=True):
    """What the nodes publish (a fleet, its mig.profiles) and what each pod asks for."""

    label: str
    fleet: str
    need: Need
    mig_profiles: tuple[str, ...] = ()
    # Diagnostic only: every device keeps its counters and the attributes the selectors read.
    bare: bool = False


_MIG_1G = Need("mig", profile="1g.10gb")
_SHARE = Need("vgpu", memory_bytes=10 * GIB, cores=15)
SHAPES: dict[str, CostShape] = {
    "whole": CostShape("whole GPU", "whole", Need("gpu")),
    "mig": CostShape("MIG 1g.10gb", "mig-dynamic", _MIG_1G),
    "vgpu-share": CostShape("vGPU share 10Gi/15%", "vgpu-capacity", _SHARE),
    "vgpu-partition": CostShape("vGPU partition 10Gi", "vgpu-partitions", _SHARE),
    "mig-1g": CostShape("MIG 1g.10gb, mig.profiles [1g.10gb]", "mig-dynamic", _MIG_1G, ("1g.10gb",)),
    "mig-4": CostShape(
        "MIG 1g.10gb, mig.profiles [1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb]",
        "mig-dynamic",
        _MIG_1G,
        ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"),
    ),
    "mig-bare": CostShape("MIG 1g.10gb, bare placements (diagnostic)", "mig-dynamic", _MIG_1G, bare=True),
}
# Diagnostic: the simplest devices in as many slices a node as a shape of ours publishes (dynamic
# MIG: 4 of devices and 1 of counter sets), which tells a slice's cost from a device's.
SPLIT_SHAPES: dict[str, int] = {"simplest-5-slices": 5, "simplest-8-slices": 8}
SHAPE_KEYS: tuple[str, ...] = (*SHAPES, *SPLIT_SHAPES)
DEFAULT_SHAPES = ("whole", "mig", "vgpu-share", "vgpu-partition")
SLI = "scheduler_pod_scheduling_sli_duration_seconds"
ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
EXTENSION = "scheduler_framework_extension_point_duration_seconds"
EXTENSION_POINTS = ("PreFilter", "Filter", "Score", "Reserve")
CREATE_CONCURRENCY = 32


def simple_slices(node: str, slices: int = 1) -> list[dict[str, Any]]:
    """The node's 8 simplest devices in `slices` slices of one pool (dealt in turn)."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-simple-{part}"},
            "spec": {
                "driver": SIMPLE_DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": slices},
                "devices": [{"name": f"gpu-{index}"} for index in range(part, GPUS_PER_NODE, slices)],
            },
        }
        for part in range(slices)
    ]


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
        # CPU time is what the scheduler spent, whatever else the machine ran meanwhile.
        "scheduler_cpu_ms_per_pod": round(total(after, "process_cpu_seconds_total") * 1000 / pods, 2),
        "mean_ms": {point: _mean_ms(after, point) for point in EXTENSION_POINTS},
        "attempts": total(after, "scheduler_schedule_attempts_total"),
        "unschedulable_attempts": total(after, "scheduler_schedule_attempts_total", result="unschedulable"),
    }


def _mean_ms(samples: Samples, extension_point: str) -> float | None:
    """The mean of one extension point's durations (all nodes of one attempt are one observation)."""
    count = total(samples, f"{EXTENSION}_count", extension_point=extension_point)
    spent = total(samples, f"{EXTENSION}_sum", extension_point=extension_point)
    return round(spent * 1000 / count, 2) if count else None


async def _all_bound(api: Api, namespace: str, pods: int) -> bool:
    return await _bound(api, namespace) >= pods


def _bare(device: Device) -> Device:
    kept = {
        name: device.attributes[name] for name in (names.TYPE, names.PROFILE) if name in device.attributes
    }
    return replace(device, attributes=kept, capacity={})


def shape_nodes(shape: CostShape, nodes: int) -> list[FleetNode]:
    """The fleet's nodes as the shape publishes them."""
    found = fleet_nodes(shape.fleet, nodes, "binpack", [shape.need], shape.mig_profiles)
    if not shape.bare:
        return found
    stripped = []
    for node in found:
        devices = tuple(_bare(device) for device in node.inventory.devices)
        inventory = replace(node.inventory, devices=devices, device_by_name={d.name: d for d in devices})
        stripped.append(replace(node, inventory=inventory))
    return stripped


async def _simplest(
    api: Api, pki: Path, nodes: int, pods: int, namespace: str, slices: int = 1
) -> dict[str, Any]:
    """One burst against the simplest slices, published for the burst and deleted after it."""
    await cluster_objects.clear_slices(api)
    for node in range(nodes):
        for body in simple_slices(node_name(node), slices):
            await api.create(f"{RESOURCE}/resourceslices", body)
    await api.create(f"{CORE}/namespaces", objects.namespace(namespace))
    await cluster_objects.make_namespace_ready(api, namespace)
    await api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", _template("simple"))
    await asyncio.sleep(2)  # the scheduler's informers see the slices
    row = await _burst(api, pki, namespace, "simple", pods)
    split = "" if slices == 1 else f" in {slices} slices a node"
    say(f"cost at {nodes} nodes, simplest slices{split}: {row['pods_per_second']} pods/s")
    await cluster_objects.drop_namespace(api, namespace)
    of_the_simple_driver = (("fieldSelector", f"spec.driver={SIMPLE_DRIVER}"),)
    await api.delete(f"{RESOURCE}/resourceslices", of_the_simple_driver, within=cluster_objects.WAIT)
    simplest = {"shape": "simplest (1 device per GPU, no attributes)", "key": "simplest"}
    if slices > 1:
        simplest = {
            "shape": f"simplest, in {slices} slices a node (diagnostic)",
            "key": f"simplest-{slices}-slices",
        }
    shaped = {"devices_per_node": GPUS_PER_NODE, "counter_sets_per_node": 0, "slices_per_node": slices}
    return {"nodes": nodes, **simplest, **shaped, **row}


def _ratio(pace: float, base: float) -> float | None:
    return round(pace / base, 3) if base else None


async def measure(
    api: Api,
    kubeconfig: Path,
    pki: Path,
    nodes: int,
    pods_per_node: int,
    run: int,
    shapes: tuple[str, ...] = DEFAULT_SHAPES,
    progress: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Per slice shape at this fleet size, a burst against the simplest slices, then one against
    the shape: each shape's ratio is to the baseline measured just before it, so a machine
    whose load drifts during the run (other work on it) moves both sides of a ratio alike. The
    simplest rows' own ratio is to their mean, which shows that drift."""
    rows = []
    pods = nodes * pods_per_node
    for index, key in enumerate(shapes):
        baseline = await _simplest(api, pki, nodes, pods, f"cost-{run}-{index}-simplest")
        rows.append(baseline)
        if key in SPLIT_SHAPES:
            split = await _simplest(api, pki, nodes, pods, f"cost-{run}-{index}", SPLIT_SHAPES[key])
            paired = baseline["pods_per_second"]
            split["simplest_pods_per_second"] = paired
            split["throughput_vs_simplest"] = _ratio(split["pods_per_second"], paired)
            rows.append(split)
            if progress:
                progress(rows)
            continue
        shape = SHAPES[key]
        fleet_of = shape_nodes(shape, nodes)
        await cluster_objects.clear_slices(api)
        async with publishing(kubeconfig, fleet_of) as publishers:
            await publishers.converged()
            namespace = f"cost-{run}-{index}"
            templates = await cluster_objects.make_namespace(api, namespace, [shape.need])
            await asyncio.sleep(2)
            row = await _burst(api, pki, namespace, templates[shape.need], pods)
            inventory = fleet_of[0].inventory
            published = {
                "devices_per_node": len(inventory.devices),
                "counter_sets_per_node": len(inventory.counter_sets),
            }
            paired = baseline["pods_per_second"]
            ratio = _ratio(row["pods_per_second"], paired)
            rows.append(
                {
                    "nodes": nodes,
                    "shape": shape.label,
                    "key": key,
                    **published,
                    **row,
                    "simplest_pods_per_second": paired,
                    "throughput_vs_simplest": ratio,
                }
            )
            pace = row["pods_per_second"]
            say(f"cost at {nodes} nodes, {shape.label}: {pace} pods/s, {ratio}x the simplest")
            await cluster_objects.drop_namespace(api, namespace)
        if progress:
            progress(rows)
    simplest = [row for row in rows if row["key"] == "simplest"]
    mean = sum(row["pods_per_second"] for row in simplest) / len(simplest) if simplest else 0
    for row in simplest:
        row["throughput_vs_simplest"] = _ratio(row["pods_per_second"], mean)
    return rows
