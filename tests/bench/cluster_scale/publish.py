"""Every fleet node's ResourceSlices, published by the agent's own slice controller
(`publish.controller`) against the real API server: one controller per node, all in this
process's event loop, each with its own connection pool as each node's agent has."""

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.kubeconfig import load_kubeconfig
from dra_driver.kube.slice_api import SliceApi
from dra_driver.observability.metrics import PublishMetrics
from dra_driver.publish.controller import ResourceSliceController
from tests.bench.cluster_scale.fleet import FleetNode

DRIVER = DEFAULT_DRIVER_NAME
# 500 nodes of dynamic MIG (2,500 slices) after an earlier shape took longer than 300 s on 2 busy cores.
CONVERGE_TIMEOUT = 900.0


class Publishers:
    def __init__(self, controllers: dict[str, ResourceSliceController], metrics: PublishMetrics) -> None:
        self.controllers = controllers
        self.metrics = metrics

    async def converged(self) -> float:
        """Seconds until every controller's slices equal its plan (TimeoutError after CONVERGE_TIMEOUT)."""
        started = time.monotonic()
        waits = [controller.status.converged.wait() for controller in self.controllers.values()]
        await asyncio.wait_for(asyncio.gather(*waits), CONVERGE_TIMEOUT)
        return time.monotonic() - started


@asynccontextmanager
async def publishing(kubeconfig: Path, nodes: Sequence[FleetNode]) -> AsyncIterator[Publishers]:
    access = await load_kubeconfig(kubeconfig)
    clients = [KubeClient(access) for _ in nodes]
    metrics = PublishMetrics()
    controllers = {
        node.name: ResourceSliceController(
            SliceApi(client, DRIVER, node.name), DRIVER, node.name, node.inventory, metrics=metrics
        )
        for node, client in zip(nodes, clients, strict=True)
    }
    tasks = [asyncio.create_task(controller.run()) for controller in controllers.values()]
    try:
        yield Publishers(controllers, metrics)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(client.close() for client in clients))
