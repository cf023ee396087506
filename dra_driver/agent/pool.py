"""The one owner of what the node offers and publishes.

Three things change what the slices should say: the GPUs' plans (a node config applied), the
health state (a fault, a recovery) and what the API server stores (its layout, a dropped
feature). Each arrives here, `publish.desired.desired_pool` turns the three into the pool, and
the pool goes out: the untainted inventory to the claim engine, the tainted one to the
ResourceSlice controller, device health to the kubelet stream and the metrics. A fourth input,
the GPUs' MPS daemons, changes only that device health, never the slices (health.mps_daemons
says why). Nothing here decides a taint, a fallback or a limit.
"""

import asyncio
import os
import time
from collections.abc import Callable, Sequence

import structlog

from dra_driver.claims.effect_entries import GpuMpsEntry
from dra_driver.claims.engine import ClaimEngine
from dra_driver.claims.sharing.sharing import gpu_daemon_key
from dra_driver.config.settings import NodeSettings
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.node_config import GpuPlan
from dra_driver.health.census import device_labels
from dra_driver.health.model import NodeHealth
from dra_driver.health.monitor import log_change
from dra_driver.health.mps_daemons import GpuDaemons
from dra_driver.health.tracker import HealthState, node_health
from dra_driver.kube.slice_api import SliceApi
from dra_driver.observability.metrics import AgentMetrics
from dra_driver.observability.server import Readiness
from dra_driver.publish.controller import ResourceSliceController
from dra_driver.publish.desired import ApiCapabilities, DesiredPool, desired_pool
from dra_driver.publish.diff import Write
from dra_driver.publish.dry_run import print_writes
from dra_driver.state.shared_locks import exclusive, open_lock_file, try_exclusive

log = structlog.get_logger("dra_driver.node")

# Held by the one agent process on the node that publishes the ResourceSlices.
PUBLISHER_LOCK = "publisher.lock"
# How soon a waiting agent notices that the publishing one has stopped.
PUBLISHER_POLL_SECONDS = 0.2


def log_fallback(note: str) -> None:
    """One wording for a GPU offered in another mode than its config asks, whether the server's
    answer or a node config brought the fallback."""
    log.warning("GPU offered differently: the cluster cannot use a feature", note=note)


class NodePool:
    def __init__(
        self,
        settings: NodeSettings,
        inventory: Inventory,
        engine: ClaimEngine,
        health_out: Callable[[NodeHealth], None],
        metrics: AgentMetrics,
        *,
        track_offers: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`inventory`: what the engine was built with, as the node is at start (no fault seen,
        nothing known of the server yet). `health_out`: the kubelet health stream, which gets
        device health as it is at start right away. `track_offers`: remember the plan each GPU
        was offered under from the start (False: named configs, whose first plan is not the node's)."""
        self._settings = settings
        self._engine = engine
        self._health_out = health_out
        self._metrics = metrics
        self._plans = inventory.plans
        self._health = HealthState(started_at=clock())
        self._daemons = GpuDaemons()
        self._capabilities = ApiCapabilities()
        self.pool = DesiredPool(inventory, inventory)
        # The plan each GPU was last offered under (by UUID): what its prepared claims expect. None
        # until this process offers something: claims of an earlier run cannot be told apart.
        self.offered: dict[str, GpuPlan] | None = None
        if track_offers:
            self._offer(inventory.plans)
        self.publisher: ResourceSliceController | None = None
        self._send_health()

    @property
    def inventory(self) -> Inventory:
        """What claims are prepared against now (untainted)."""
        return self.pool.offered

    @property
    def capabilities(self) -> ApiCapabilities:
        return self._capabilities

    def use_plans(self, plans: Sequence[GpuPlan]) -> None:
        self._plans = tuple(plans)
        self._update()

    def health_changed(self, state: HealthState, cause: str) -> None:
        self._health = state
        self._update(health_cause=cause)

    def gpu_daemon_reported(self, gpu_uuid: str, up: bool | None, at: float) -> None:
        """The claim engine's report on a GPU's MPS daemon (`up` None: stopped with its last share):
        while it is down, the devices of the GPU's prepared vGPU shares are unhealthy."""
        daemons = self._daemons.reported(gpu_uuid, up, gpu_daemon_key(gpu_uuid), at)
        if daemons is self._daemons and not any(state.down for state in daemons.states.values()):
            return  # every share's prepare reports its daemon up: this is the pod-startup path
        daemons = daemons.with_share_devices(self._share_devices())
        if daemons != self._daemons:
            self._daemons = daemons
            self._update(health_cause="mps-daemon")

    def _share_devices(self) -> dict[str, frozenset[str]]:
        """By GPU: the devices of the prepared vGPU shares that use its MPS daemon."""
        devices: dict[str, set[str]] = {}
        for record in self._engine.prepared_claims.values():
            for gpu_uuid in (entry.gpu_uuid for entry in record.entries(GpuMpsEntry)):
                devices.setdefault(gpu_uuid, set()).update(
                    device.device for device in record.devices if device.pool == self._settings.node_name
                )
        return {gpu_uuid: frozenset(names) for gpu_uuid, names in devices.items()}

    def capabilities_changed(self, capabilities: ApiCapabilities) -> None:
        """The controller's report: what the server stores. Newly dropped features move GPUs to
        modes it stores whole, for publishing and preparing alike."""
        self._capabilities = capabilities
        self._update()

    def _update(self, *, health_cause: str | None = None) -> None:
        pool = desired_pool(self._plans, self._capabilities, self._health, self._settings.driver_name)
        if pool.offered.plans != self.pool.offered.plans:
            # Said once per fallback: when the server's answer or a new node config brings it.
            for note in pool.notes:
                if note not in self.pool.notes:
                    log_fallback(note)
            self._offer(pool.offered.plans)
            self._engine.use_inventory(pool.offered)
            for note in pool.offered.notes:
                log.warning("device left out", note=note)
        else:  # the same plans: the engine keeps the inventory it has
            pool = DesiredPool(self.pool.offered, pool.published, pool.notes)
        published_changed = pool.published != self.pool.published
        self.pool = pool
        health = self._send_health()
        if health_cause is not None:
            log_change(health, health_cause)
        if published_changed and self.publisher is not None:
            self.publisher.set_inventory(pool.published)

    def _send_health(self) -> NodeHealth:
        health = node_health(self._health, self.pool.offered, self._settings.node_name, self._daemons)
        self._health_out(health)
        self._metrics.set_devices(device_labels(self.pool.offered, health))
        return health

    def _offer(self, plans: Sequence[GpuPlan]) -> None:
        self.offered = {**(self.offered or {}), **{plan.gpu.uuid: plan for plan in plans}}

    async def publish_while_holding_lock(self, slice_api: SliceApi, readiness: Readiness) -> None:
        """One agent per node publishes: while the old and the new pod of a rolling update
        overlap, two controllers would each repair the other's slices. The one holding the
        node's publisher lock publishes; the other counts as published (its peer's slices
        describe the same GPUs) and takes over, adopting the slices as they are, once the peer
        has stopped."""
        fd = open_lock_file(self._settings.state_dir / PUBLISHER_LOCK)
        try:
            if not try_exclusive(fd):
                log.info("another agent on this node publishes the ResourceSlices; taking over when it stops")
                readiness.published(True)
                await exclusive(fd, longest_poll=PUBLISHER_POLL_SECONDS)
                log.info("taking over publishing the ResourceSlices")
            dry_run: Callable[[tuple[Write, ...]], None] | None = (
                print_writes if self._settings.dry_run else None
            )
            self.publisher = ResourceSliceController(
                slice_api,
                self._settings.driver_name,
                self._settings.node_name,
                self.pool.published,
                sync_delay=self._settings.sync_delay,
                on_capabilities=self.capabilities_changed,
                metrics=self._metrics.publish,
                dry_run=dry_run,
            )
            ready = asyncio.create_task(
                self._ready_once_published(self.publisher, readiness), name="published"
            )
            try:
                await self.publisher.run()
            finally:
                ready.cancel()
        finally:
            os.close(fd)

    @staticmethod
    async def _ready_once_published(publisher: ResourceSliceController, readiness: Readiness) -> None:
        """Ready once the slices were published the first time; later republishing (a fault, a
        fallback) does not make the node unready."""
        await publisher.status.converged.wait()
        readiness.published(True)
