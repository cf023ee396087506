"""The ResourceSlice controller: keeps the API server's slices of this node equal to the plan.

One watch (field selectors: our driver, our node; nothing cluster-wide) keeps a local copy of
the stored slices (`slice_copy`, in resourceVersion order). A sync compares that copy with the
plan (`diff.plan_sync`, pure) and writes the difference. Syncs run from a rate-limited work queue:
- right away when the inventory changes;
- `sync_delay` after someone else changed or deleted one of our slices (our own writes come back
  through the watch with the resourceVersion we already hold, so they schedule nothing, and a
  quiet cluster sees no writes at all);
- with per-key exponential backoff after a failure. A failure that leaves the outcome unknown
  (no answer, 5xx, conflict) makes the next sync list again before writing, so a create that
  did land is never made twice.

What the slices should say is not decided here (`publish.desired`): the controller reports what
it learns about the server (its layout, the fields it drops) to `on_capabilities`, as upstream's
controller reports through its error handler, and the owner of the pool answers, if at all,
with `set_inventory`.
"""

import asyncio
from collections.abc import Callable

import msgspec
import structlog

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import TransientFault
from dra_driver.base.json_object import JsonObject
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.slices import SliceLayout, SlicePlanError, layout_for, plan_slices, slices_to_api
from dra_driver.kube.calls import WatchEvent
from dra_driver.kube.errors import KEPT_TRYING, ApiError
from dra_driver.kube.slice_api import SliceApi
from dra_driver.kube.watching import WatchPosition, list_and_watch
from dra_driver.observability.metrics import PublishMetrics
from dra_driver.publish.capabilities import (
    DISPLAY_ONLY_FEATURES,
    ApiFeature,
    describe_drops,
    dropped_fields,
    features_behind,
    sends_partition_types,
    server_kubernetes_version,
    unexplained,
)
from dra_driver.publish.desired import ApiCapabilities
from dra_driver.publish.diff import (
    Adopted,
    Create,
    Delete,
    NodeOwner,
    PoolState,
    SyncPlan,
    Update,
    Write,
    plan_sync,
)
from dra_driver.publish.slice_copy import StoredSlices
from dra_driver.publish.workqueue import ShutDown, WorkQueue

log = structlog.get_logger("dra_driver.publish")

DEFAULT_SYNC_DELAY_SECONDS = 5.0
WATCH_RETRY = Backoff(first=0.1, cap=30.0)

# Told what the server was found to store: once its version is read, and for each newly dropped feature.
CapabilityReport = Callable[[ApiCapabilities], None]


class OutdatedList(TransientFault):
    """A list answered from before changes the watch has already shown."""


class PublishStatus(msgspec.Struct):
    """What the rest of the agent (readiness, metrics, tests) may ask the controller."""

    layout: SliceLayout | None = None
    unsupported: frozenset[ApiFeature] = frozenset()
    # (major, minor) of the API server, once read.
    kubernetes_version: tuple[int, int] | None = None
    # Set once the stored slices equal the plan; cleared while a change is being written.
    converged: asyncio.Event = msgspec.field(default_factory=asyncio.Event)


class ResourceSliceController:
    def __init__(
        self,
        api: SliceApi,
        driver_name: str,
        node_name: str,
        inventory: Inventory,
        *,
        sync_delay: float = DEFAULT_SYNC_DELAY_SECONDS,
        on_capabilities: CapabilityReport | None = None,
        metrics: PublishMetrics | None = None,
        dry_run: Callable[[tuple[Write, ...]], None] | None = None,
        queue: WorkQueue[str] | None = None,
    ) -> None:
        self._api = api
        self._driver_name = driver_name
        self._node_name = node_name
        self._inventory = inventory
        self._sync_delay = sync_delay
        self._on_capabilities = on_capabilities
        self._metrics = metrics or PublishMetrics()
        self._dry_run = dry_run
        self._queue: WorkQueue[str] = queue or WorkQueue()
        self.status = PublishStatus()
        self._owner: NodeOwner | None = None
        self._copy = StoredSlices()
        self._stale = True
        self._adopted: dict[str, Adopted] = {}
        self._reported_unexplained = False
        self._last_dry_run: tuple[str, ...] | None = None
        self._sync_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._watch_position = WatchPosition()

    @property
    def key(self) -> str:
        return self._node_name

    @property
    def inventory(self) -> Inventory:
        """What is being published: the last inventory set."""
        return self._inventory

    @property
    def capabilities(self) -> ApiCapabilities:
        return ApiCapabilities(self.status.layout, self.status.unsupported, self.status.kubernetes_version)

    def set_inventory(self, inventory: Inventory) -> None:
        """Publishes a changed inventory (hardware, health or configuration) right away."""
        self._inventory = inventory
        self.status.converged.clear()
        self._queue.add(self.key)

    async def run(self) -> None:
        """Runs until cancelled; the slices stay in place afterwards (kubelet removes them when
        the plugin is gone, the Node's garbage collection when the node is)."""
        self._queue.add(self.key)
        watcher = asyncio.create_task(self._watch_forever(), name="resourceslice-watch")
        try:
            await self._work()
        finally:
            self._queue.shut_down()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    # -- the work queue ----------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            try:
                key = await self._queue.get()
            except ShutDown:
                return
            try:
                await self._sync()
            except KEPT_TRYING as error:  # a TransientFault, or the server's final answer
                delay = self._queue.add_rate_limited(key)
                log.warning(
                    "resourceslice sync failed; retrying",
                    error=str(error),
                    retry_in_seconds=round(delay, 3),
                    failures=self._queue.limiter.failures(key),
                )
            else:
                self._queue.forget(key)
            finally:
                self._queue.done(key)

    # -- the watch ---------------------------------------------------------------------------------

    async def _watch_forever(self) -> None:
        await list_and_watch(
            self._list_for_watch,
            self._api.watch_slices,
            self._on_event,
            backoff=WATCH_RETRY,
            log=log,
            what="resourceslice",
            position=self._watch_position,
        )

    async def _list_for_watch(self) -> str:
        async with self._sync_lock:
            if self._watch_position.resource_version is None:  # a sync may have listed meanwhile
                self._copy.forget_newest()  # no watch runs now: no event is newer than this list
                await self._list()
        return self._watch_position.resource_version or ""

    async def _list(self) -> None:
        items, resource_version = await self._api.list_slices()
        if self._copy.overtaken(resource_version):  # a slow answer, overtaken by watch events
            raise OutdatedList(
                f"LIST resourceslices: answered at {resource_version}, older than {self._copy.newest_seen}"
            )
        changed = self._copy.take_list(items, resource_version)
        self._watch_position.resource_version = resource_version
        self._stale = False
        if changed:
            self._queue.add(self.key)

    def _on_event(self, event: WatchEvent) -> None:
        """A change the watch shows (bookmarks, which change nothing of ours, do not come here:
        the loop moves the watch position on with them)."""
        name = self._copy.take_event(event.kind, event.object)
        if name is None:
            return
        log.info("resourceslice changed on the server; sync scheduled", slice=name, change=event.kind)
        self._queue.add_after(self.key, self._sync_delay)

    # -- one sync ----------------------------------------------------------------------------------

    async def _sync(self) -> None:
        async with self._sync_lock:
            layout = await self._layout()
            owner = await self._node_owner()
            if self._stale:
                await self._list()
            try:
                desired = slices_to_api(
                    plan_slices(self._inventory, layout),
                    self._driver_name,
                    self._node_name,
                    partition_types=sends_partition_types(
                        self.status.kubernetes_version, self.status.unsupported
                    ),
                )
            except SlicePlanError as error:
                # Not retried: only a different inventory or server version can fix it.
                log.error("cannot publish this inventory", error=str(error), layout=layout)
                return
            plan = plan_sync(
                desired, PoolState(list(self._copy.by_name.values()), self._adopted), self._node_name, owner
            )
            if self._dry_run is not None:
                self._show_dry_run(plan)
                return
            planned_for = self._inventory
            made = [write for write in plan.writes if await self._apply_unless_replanned(write, planned_for)]
            if made:
                log.info(
                    "resourceslices published",
                    pool=self._node_name,
                    generation=plan.generation,
                    deleted=sum(isinstance(write, Delete) for write in made),
                    updated=sum(isinstance(write, Update) for write in made),
                    created=sum(isinstance(write, Create) for write in made),
                    left_for_next_sync=len(plan.writes) - len(made),
                )
            if self._inventory is planned_for:
                self.status.converged.set()

    async def _apply_unless_replanned(self, write: Write, planned_for: Inventory) -> bool:
        """A fallback in the middle of a sync replaces the inventory and queues a new sync; the
        rest of this plan would only be undone by it."""
        if self._inventory is not planned_for:
            return False
        await self._apply(write)
        return True

    async def _layout(self) -> SliceLayout:
        if self.status.layout is None:
            version = server_kubernetes_version(await self._api.server_version())
            self.status.kubernetes_version = version
            self.status.layout = layout_for(version)
            log.info(
                "API server version read", kubernetes=f"{version[0]}.{version[1]}", layout=self.status.layout
            )
            self._report_capabilities()
        return self.status.layout

    async def _node_owner(self) -> NodeOwner:
        if self._owner is None:
            self._owner = NodeOwner(self._node_name, await self._api.node_uid())
        return self._owner

    def _show_dry_run(self, plan: SyncPlan) -> None:
        described = tuple(write.describe() for write in plan.writes)
        if described != self._last_dry_run and self._dry_run is not None:
            self._last_dry_run = described
            self._dry_run(plan.writes)
        self.status.converged.set()

    async def _apply(self, write: Write) -> None:
        verb = type(write).__name__.lower()
        try:
            match write:
                case Delete(name=name, uid=uid, resource_version=version):
                    await self._api.delete_slice(name, uid, version)
                    self._copy.deleted(name)
                    self._adopted.pop(name, None)
                case Update(name=name, body=body):
                    self._accept(body, await self._api.replace_slice(name, body))
                case Create(body=body):
                    self._accept(body, await self._api.create_slice(body))
        except ApiError as error:
            self._metrics.slice_api_errors.labels(verb=verb, status=str(error.status)).inc()
            # Unknown outcome, or our copy is out of date: read the truth before writing again.
            self._stale = True
            raise
        self._metrics.slice_writes.labels(verb=verb).inc()

    def _accept(self, sent: JsonObject, stored: JsonObject) -> None:
        name = self._copy.take_answer(stored)
        paths = dropped_fields(sent, stored)
        if not paths:
            self._adopted.pop(name, None)
            return
        self._adopted[name] = Adopted(sent=sent["spec"], stored=stored.get("spec", {}))
        self._report_drops(paths)

    def _report_drops(self, paths: tuple[str, ...]) -> None:
        features = features_behind(paths)
        new_features = features - self.status.unsupported
        odd = unexplained(paths)
        if not new_features and (not odd or self._reported_unexplained):
            return
        self._reported_unexplained = self._reported_unexplained or bool(odd)
        self.status.unsupported |= features
        for feature in features:
            self._metrics.api_features_missing.labels(feature=feature).set(1)
        message = describe_drops(paths, features)
        if not odd and new_features <= DISPLAY_ONLY_FEATURES:
            # Nothing the scheduler sees is lost; the field is no longer sent (see _sync).
            log.info("the API server drops a display-only field of our ResourceSlices", detail=message)
            self._report_capabilities()
            return
        log.warning(
            "the API server drops fields of our ResourceSlices", detail=message, dropped=list(paths[:20])
        )
        task = asyncio.get_running_loop().create_task(self._event(message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if new_features:
            self._report_capabilities()

    def _report_capabilities(self) -> None:
        """Synchronous, so an inventory set in answer is the one the running sync plans."""
        if self._on_capabilities is not None:
            self._on_capabilities(self.capabilities)

    async def _event(self, message: str) -> None:
        try:
            await self._api.create_node_event(
                (self._owner.uid if self._owner else ""), "ResourceSliceFieldsDropped", message, "Warning"
            )
        except ApiError as error:
            log.warning("could not record the dropped-fields Event on the Node", error=str(error))
