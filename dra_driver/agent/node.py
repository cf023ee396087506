"""`dra-driver node`: the node agent, wired together from its parts.

The same assembly runs in a cluster (claims from the API server) and in the demo (claims from
a file), so the demo exercises exactly the code kubelet talks to. The claim engine behind
kubelet's sockets is built in `claim_serving.py`; the process around a cluster's agent (signals,
the API client, the probe endpoint) is `node_process.py`.
"""

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import structlog
from msgspec.structs import replace

from dra_driver.agent.claim_serving import claim_record_store, hami_core, serve_claims
from dra_driver.agent.config_reports import PostEvent, ProblemReporter
from dra_driver.agent.daemon_reports import DaemonReports
from dra_driver.agent.errors import SetupError, StartupError
from dra_driver.agent.gpu_platform import DriverWait, Platform, discover_gpus, open_platform
from dra_driver.agent.mps_daemons import with_mps_pods
from dra_driver.agent.node_configs import NamedConfigs, gpus_in_use, replan, unclaimed_mig
from dra_driver.agent.node_watch import NodeFacts, follow_node
from dra_driver.agent.pool import NodePool, log_fallback
from dra_driver.agent.usage import usage_sampler
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.engine import ClaimEngine
from dra_driver.claims.source import ClaimSource
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.config.node_config_files import load_node_config
from dra_driver.config.settings import InventorySettings, NodeSettings
from dra_driver.devices.config_files import ConfigChoice
from dra_driver.devices.inventory import Inventory, build_inventory, node_inventory
from dra_driver.devices.node_config import NodeConfigError
from dra_driver.hardware.backend import HardwareBackend
from dra_driver.health.monitor import HealthMonitor
from dra_driver.kube.errors import ApiError
from dra_driver.kube.node_api import NodeApi
from dra_driver.kube.pod_api import PodApi
from dra_driver.kube.slice_api import SliceApi
from dra_driver.observability.metrics import AgentMetrics
from dra_driver.observability.server import Readiness
from dra_driver.plugin.server import KubeletPluginServer
from dra_driver.publish.desired import ApiCapabilities
from dra_driver.state.boot_id import current_boot_id

log = structlog.get_logger("dra_driver.node")


async def discover_inventory(
    settings: InventorySettings, state_dir: Path | None = None
) -> tuple[HardwareBackend, Inventory]:
    """The hardware, opened, and what it offers under the node configuration; a GPU it does not
    fit fails the whole call (`inspect` shows the mistake rather than hiding the GPU)."""
    try:
        node_config = load_node_config(settings.node_config)
    except NodeConfigError as error:
        raise SetupError(str(error)) from error
    hardware, gpus = await discover_gpus(settings, state_dir)
    try:
        inventory = node_inventory(gpus, node_config)
    except NodeConfigError as error:
        await hardware.close()
        origin = settings.node_config or "default settings (no --node-config)"
        raise SetupError(f"node config {origin}: {error}") from error
    return hardware, inventory


class NodeAgent:
    """The running agent: kubelet's plugin, the claim engine, and the node's pool, with the
    tasks that follow health, node configs and registration."""

    def __init__(
        self,
        settings: NodeSettings,
        platform: Platform,
        engine: ClaimEngine,
        server: KubeletPluginServer,
        pool: NodePool,
        metrics: AgentMetrics,
        readiness: Readiness,
        reporter: ProblemReporter,
    ) -> None:
        self.settings = settings
        self.platform = platform
        self.engine = engine
        self.server = server
        self.pool = pool
        self.metrics = metrics
        self.readiness = readiness
        self.reporter = reporter
        self._publishing: asyncio.Task[None] | None = None
        self._background: tuple[asyncio.Task[None], ...] = ()
        self.claim_status: ClaimStatusWriter | None = None
        self._usage = usage_sampler(settings, platform, engine, pool, metrics.usage)

    @property
    def hardware(self) -> HardwareBackend:
        return self.platform.hardware

    @property
    def inventory(self) -> Inventory:
        return self.pool.inventory

    @classmethod
    async def start(
        cls,
        settings: NodeSettings,
        claim_source: ClaimSource,
        slice_api: SliceApi | None = None,
        metrics: AgentMetrics | None = None,
        readiness: Readiness | None = None,
        node_api: NodeApi | None = None,
        on_driver_wait: DriverWait | None = None,
        claim_status: ClaimStatusWriter | None = None,
        pod_api: PodApi | None = None,
    ) -> "NodeAgent":
        """`slice_api` None: no cluster (the demo), so nothing is published. `node_api`: where
        the Node's labels are read, which --node-configs needs in a cluster. `on_driver_wait`:
        told when real GPUs start waiting for their driver to appear, and when it has.
        `claim_status`: writes prepared claims' status.devices (None: no cluster)."""
        metrics = metrics or AgentMetrics()
        readiness = readiness or Readiness()
        cdi_specs = CdiSpecDirectory(settings.cdi_dir, settings.driver_name)
        choice = initial_config(settings)
        has_hami = settings.hami_core_library is not None
        records, boot_id = claim_record_store(settings), current_boot_id()
        # Read before and after the GPUs are, so a peer agent's claim (a rolling update) that
        # makes or removes a MIG instance meanwhile is in one of the reads (unclaimed_mig).
        claimed = list((await asyncio.to_thread(records.read_all_of_boot, boot_id)).values())
        platform = await open_platform(settings, cdi_specs, on_driver_wait)
        try:
            platform = with_mps_pods(settings, platform, pod_api)
        except StartupError:
            await platform.close()
            raise
        claimed += (await asyncio.to_thread(records.read_all_of_boot, boot_id)).values()
        platform = replace(platform, gpus=unclaimed_mig(platform.gpus, claimed))
        first = replan(choice, platform.gpus, None, frozenset(), ApiCapabilities(), hami_core=has_hami)
        inventory = build_inventory(first.plans)
        log.info(
            "hardware discovered",
            hardware=platform.hardware.description,
            pool=settings.node_name,
            devices=[device.name for device in inventory.devices],
        )
        for note in inventory.notes:
            log.warning("device left out", note=note)
        daemon_reports = DaemonReports()
        engine, server = await serve_claims(
            settings,
            platform,
            cdi_specs,
            claim_source,
            metrics,
            inventory,
            hami_core(settings, inventory, first.problems),
            claim_status,
            daemon_reports,
        )
        pool = NodePool(
            settings,
            inventory,
            engine,
            server.health.update,
            metrics,
            track_offers=settings.node_configs is None,
        )
        reporter = ProblemReporter(
            settings.node_name, metrics, None if slice_api is None else _event_poster(slice_api)
        )
        daemon_reports.follow(pool.gpu_daemon_reported)
        agent = cls(settings, platform, engine, server, pool, metrics, readiness, reporter)
        agent.claim_status = claim_status
        reporter.report(choice, first.problems, ())
        agent.start_health_monitor()
        if settings.mps_probe_interval > 0:
            agent._run(agent._probe_gpu_daemons(settings.mps_probe_interval), "gpu-mps-probe")
        if settings.node_configs is not None:
            agent.follow_named_configs(settings.node_configs, slice_api, node_api)
        elif slice_api is not None:
            agent.start_publishing(slice_api)
        if slice_api is None:
            readiness.published(True)  # no cluster: nothing to publish
        agent._run(agent._follow_registration(), "registration")
        if agent._usage is not None:
            agent._usage.start()
        return agent

    def _run(self, work: Coroutine[Any, Any, None], name: str) -> None:
        self._background += (asyncio.create_task(work, name=name),)

    # -- node configs changing while the agent runs ---------------------------------------------

    def follow_named_configs(
        self, directory: Path, slice_api: SliceApi | None, node_api: NodeApi | None
    ) -> None:
        """The Node's label picks the config. Publishing starts once the label was read: until
        then the node's config is unknown, and publishing any other would offer modes nobody
        asked for (and an empty pool would take the node's devices away)."""
        named = NamedConfigs(directory, self.settings.node_config_label, self._use_config)
        self._run(named.poll_forever(), "node-config-files")
        if node_api is None:
            named.without_node()
            return

        def node_changed(facts: NodeFacts) -> None:
            named.node_changed(facts)
            if self._publishing is None and slice_api is not None:
                self.start_publishing(slice_api)

        self._run(follow_node(node_api, node_changed), "node-watch")

    def _use_config(self, choice: ConfigChoice) -> bool:
        """Re-plans every GPU under `choice`; answers whether GPUs wait for their claims."""
        gpus = self.platform.gpus
        in_use = gpus_in_use(self.engine.prepared_claims.values(), gpus)
        has_hami = self.settings.hami_core_library is not None
        result = replan(choice, gpus, self.pool.offered, in_use, self.pool.capabilities, hami_core=has_hami)
        self.reporter.report(choice, result.problems, result.waiting)
        if result.plans != self.inventory.plans:
            log.info(
                "node config applied",
                config=choice.origin,
                gpus={plan.gpu.index: plan.mode for plan in result.plans},
            )
            for note in result.notes:
                log_fallback(note)
            self.pool.use_plans(result.plans)
        return bool(result.waiting)

    async def _follow_registration(self) -> None:
        registration = self.server.registration
        while True:
            await registration.status_changed.wait()
            registration.status_changed.clear()
            registered = registration.status is not None and registration.status.registered
            self.readiness.registered(registered)
            self.metrics.kubelet_registered.set(int(registered))

    def start_health_monitor(self) -> None:
        """XIDs and lost GPUs become taints on the published devices and the kubelet health
        stream; a simulated node also takes faults from `dra-driver simulate-fault`."""
        for name, work in self.platform.background:
            self._run(work(), name)
        monitor = HealthMonitor(
            self.platform.health_source,
            on_change=self.pool.health_changed,
            policy=self.settings.xid_policy,
            recovery_seconds=self.settings.health_recovery_seconds,
        )
        self._run(monitor.run(), "health-monitor")

    async def _probe_gpu_daemons(self, interval: float) -> None:
        """A GPU's MPS daemon that dies while no share is being prepared shows within `interval`
        (the next prepare on the GPU would find it too, but pods may run for days without one).
        Its own task, off the prepare path; each probe holds one GPU's lock only while it asks."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.engine.probe_gpu_daemons()
            except Exception:  # the next probe tries again; a failing probe must not end the agent
                log.exception("checking the GPUs' MPS daemons failed")

    def start_publishing(self, slice_api: SliceApi) -> None:
        self._publishing = asyncio.create_task(
            self.pool.publish_while_holding_lock(slice_api, self.readiness), name="resourceslices"
        )

    async def stop(self) -> None:
        """Leaves the published slices in place: kubelet removes them once the plugin is gone
        for good, and a restarting agent takes them over without a gap."""
        self.readiness.registered(False)  # /readyz fails while in-flight calls finish
        self.metrics.kubelet_registered.set(0)
        if self._usage is not None:
            await asyncio.to_thread(self._usage.stop)
        for task in (*self._background, self._publishing):
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._publishing is not None:
            await asyncio.gather(self._publishing, return_exceptions=True)
        await self.server.stop()
        if self.claim_status is not None:
            await self.claim_status.close()  # pending status writes are dropped, not waited for
        self.engine.close()
        await self.platform.close()
        await self.reporter.drain()


def initial_config(settings: NodeSettings) -> ConfigChoice:
    """The config at start. Named configs: none until the Node's label is read (follow_named_configs)."""
    if settings.node_configs is not None:
        return ConfigChoice(f"the Node's label {settings.node_config_label} (not read yet)", None)
    origin = f"node config {settings.node_config}" if settings.node_config else "default settings"
    try:
        return ConfigChoice(origin, load_node_config(settings.node_config))
    except NodeConfigError as error:  # checked with the settings; changed since
        raise StartupError(str(error)) from error


def _event_poster(slice_api: SliceApi) -> PostEvent:
    async def post(reason: str, message: str) -> None:
        try:
            await slice_api.create_node_event(await slice_api.node_uid(), reason, message, "Warning")
        except ApiError as error:
            log.warning("could not post the Event on the Node", reason=reason, error=str(error))

    return post
