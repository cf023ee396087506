"""Runs the ResourceSlice controller in-process against the stand-in API server, through the
agent's client (kube_http), and reads back what the server stores."""

import asyncio
import copy
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.inventory import Inventory, build_inventory
from dra_driver.devices.slices import SliceLayout, plan_slices, slices_to_api
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.server_access import ServerAccess
from dra_driver.kube.slice_api import SliceApi
from dra_driver.observability.metrics import PublishMetrics
from dra_driver.publish.capabilities import ApiFeature, fall_back
from dra_driver.publish.controller import ResourceSliceController
from dra_driver.publish.desired import ApiCapabilities
from dra_driver.publish.diff import Write
from tests.support.agent import NODE_NAME
from tests.support.apiserver import ApiServer

DRIVER = DEFAULT_DRIVER_NAME
SLICES = "resourceslices"


def json_request(method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A plain HTTP call, as another client of the cluster (kubectl, a careless script) makes it."""
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _call(server: ApiServer, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    return json_request(method, server.url + path, body)


def add_node(server: ApiServer, name: str = NODE_NAME) -> str:
    """Creates the Node the slices are owned by; returns its uid."""
    node = _call(
        server, "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    return str(node["metadata"]["uid"])


def foreign_delete(server: ApiServer, name: str) -> None:
    _call(server, "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}")


def foreign_replace(server: ApiServer, stored: dict[str, Any]) -> None:
    _call(server, "PUT", f"/apis/resource.k8s.io/v1/resourceslices/{stored['metadata']['name']}", stored)


def stored_slices(server: ApiServer) -> list[dict[str, Any]]:
    return server.objects(SLICES)


def expected_specs(inventory: Inventory, layout: SliceLayout = "1.35") -> list[dict[str, Any]]:
    """The plan's slice specs, generation left out (it depends on history)."""
    specs = []
    for body in slices_to_api(plan_slices(inventory, layout), DRIVER, NODE_NAME):
        spec = copy.deepcopy(body["spec"])
        del spec["pool"]["generation"]
        specs.append(spec)
    return specs


def published_specs(server: ApiServer) -> list[dict[str, Any]]:
    specs = []
    for stored in stored_slices(server):
        spec = copy.deepcopy(stored["spec"])
        del spec["pool"]["generation"]
        specs.append(spec)
    return specs


def pool_problems(server: ApiServer, inventory: Inventory, layout: SliceLayout = "1.35") -> list[str]:
    """Why the stored pool is not exactly the plan (empty when it is)."""
    stored = stored_slices(server)
    problems = []
    wanted = slices_to_api(plan_slices(inventory, layout), DRIVER, NODE_NAME)
    if len(stored) != len(wanted):
        problems.append(f"{len(stored)} slices stored, {len(wanted)} planned")
    if len({s["spec"]["pool"]["generation"] for s in stored}) > 1:
        problems.append("slices of several generations")
    for held, planned in zip(stored, wanted, strict=False):
        if not held["metadata"]["name"].startswith(planned["metadata"]["generateName"]):
            problems.append(
                f"{held['metadata']['name']} is not at index {planned['metadata']['generateName']}"
            )
    if published_specs(server) != expected_specs(inventory, layout):
        problems.append("stored specs differ from the plan")
    return problems


@dataclass
class Published:
    controller: ResourceSliceController
    metrics: PublishMetrics
    dry_runs: list[tuple[Write, ...]] = field(default_factory=list)

    async def converged(self, server: ApiServer, inventory: Inventory, within: float = 10.0) -> None:
        deadline = time.monotonic() + within

        def problems() -> list[str]:
            return pool_problems(server, inventory, self.controller.status.layout or "1.35")

        # In a thread: a check takes about a hundred milliseconds, and run on the event loop it
        # starved the controller it was waiting for (a 3 s repair bound failed under two workers).
        while await asyncio.to_thread(problems):
            if time.monotonic() > deadline:
                raise AssertionError(f"not converged within {within} s: {problems()}")
            await asyncio.sleep(0.02)


def falling_back(inventory: Inventory) -> Callable[[frozenset[ApiFeature]], Inventory | None]:
    """What the node agent does when the server lacks a feature: the same GPUs, re-planned."""

    def replan(unsupported: frozenset[ApiFeature]) -> Inventory | None:
        plans, _notes = fall_back(inventory.plans, unsupported)
        return None if plans == inventory.plans else build_inventory(plans)

    return replan


def replanning(
    inventory: Inventory, controller: Callable[[], ResourceSliceController]
) -> Callable[[ApiCapabilities], None]:
    """The controller's report handler, answering as the node agent does: `falling_back`'s
    inventory, set on the controller."""
    replan = falling_back(inventory)

    def on_capabilities(capabilities: ApiCapabilities) -> None:
        if (replacement := replan(capabilities.unsupported)) is not None:
            controller().set_inventory(replacement)

    return on_capabilities


@asynccontextmanager
async def publishing(
    server: ApiServer,
    inventory: Inventory,
    *,
    sync_delay: float = 0.2,
    dry_run: bool = False,
    with_fall_back: bool = True,
) -> AsyncIterator[Published]:
    kube_client = KubeClient(ServerAccess(server.url))
    metrics = PublishMetrics()
    dry_runs: list[tuple[Write, ...]] = []
    controller: ResourceSliceController | None = None

    def built() -> ResourceSliceController:
        assert controller is not None
        return controller

    controller = ResourceSliceController(
        SliceApi(kube_client, DRIVER, NODE_NAME),
        DRIVER,
        NODE_NAME,
        inventory,
        sync_delay=sync_delay,
        on_capabilities=replanning(inventory, built) if with_fall_back else None,
        metrics=metrics,
        dry_run=dry_runs.append if dry_run else None,
    )
    task = asyncio.create_task(controller.run())
    try:
        yield Published(controller, metrics, dry_runs)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube_client.close()
