"""Part 6: publishing at scale. N nodes' slices (dynamic MIG, the largest pools: 200 devices and
8 counter sets a node) published from empty by N slice controllers at once; then a quiet
minute; then one node's configuration changed. Writes are counted by the controllers'
own metric, requests by the API server's (apiserver_request_total, by verb)."""

import asyncio
import time
from pathlib import Path
from typing import Any

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.devices.slices import plan_slices
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from tests.bench.cluster_scale import cluster_objects
from tests.bench.cluster_scale.api import Api
from tests.bench.cluster_scale.fleet import fleet_nodes
from tests.bench.cluster_scale.harness import say
from tests.bench.cluster_scale.metrics import delta, scrape, total
from tests.bench.cluster_scale.needs import Need
from tests.bench.cluster_scale.publish import publishing

REQUESTS = "apiserver_request_total"
WRITES = "dra_driver_resourceslice_writes_total"
VERBS = ("LIST", "GET", "WATCH", "POST", "PUT", "DELETE")


def _writes(registry_value: Any) -> float:
    return float(registry_value or 0.0)


async def measure(
    api: Api, kubeconfig: Path, pki: Path, api_url: str, nodes: int, quiet_seconds: float
) -> dict[str, Any]:
    fleet_of = fleet_nodes("mig-dynamic", nodes, "binpack", [Need("mig", profile="1g.10gb")])
    planned = sum(len(plan_slices(node.inventory, "1.35")) for node in fleet_of)
    await cluster_objects.clear_slices(api)
    metrics_url = f"{api_url}/metrics"
    async with publishing(kubeconfig, fleet_of) as publishers:
        registry = publishers.metrics.registry
        converge = await publishers.converged()
        creates = _writes(registry.get_sample_value(WRITES, {"verb": "create"}))
        say(f"{nodes} nodes' {planned} slices published in {converge:.1f}s with {creates:.0f} creates")
        await asyncio.sleep(5)  # the last watch events settle
        writes_before = sum(
            _writes(registry.get_sample_value(WRITES, {"verb": v})) for v in ("create", "update", "delete")
        )
        before = await scrape(metrics_url, pki, verify=True)
        await asyncio.sleep(quiet_seconds)
        after = delta(await scrape(metrics_url, pki, verify=True), before)
        writes_quiet = (
            sum(
                _writes(registry.get_sample_value(WRITES, {"verb": v}))
                for v in ("create", "update", "delete")
            )
            - writes_before
        )
        by_verb = {verb: total(after, REQUESTS, resource="resourceslices", verb=verb) for verb in VERBS}
        per_node_minute = sum(by_verb.values()) / nodes / (quiet_seconds / 60)
        first = fleet_of[0]
        # The operator turns the node's GPUs from dynamic MIG to whole GPUs.
        gpus = simulated_gpus(first.name, resolve_node_spec(first.profile))
        changed = node_inventory(gpus, NodeConfig(default=GpuSettings(mode="gpu")))
        controller = publishers.controllers[first.name]
        started = time.monotonic()
        controller.set_inventory(changed)
        await asyncio.wait_for(controller.status.converged.wait(), 60)
        republished = time.monotonic() - started
        say(
            f"quiet {quiet_seconds:.0f}s: {writes_quiet:.0f} writes, {per_node_minute:.2f} slice "
            f"requests/node/min; config change republished in {republished:.2f}s"
        )
    return {
        "nodes": nodes,
        "slices_planned": planned,
        "converge_seconds": round(converge, 1),
        "creates": creates,
        "quiet_seconds": quiet_seconds,
        "quiet_writes": writes_quiet,
        "quiet_slice_requests_by_verb": by_verb,
        "quiet_slice_requests_per_node_per_minute": round(per_node_minute, 3),
        "config_change_republish_seconds": round(republished, 2),
    }
