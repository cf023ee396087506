"""`dra-driver node`: the node agent, wired together from its parts.

The same assembly runs in a cluster (claims from the API server) and in the demo (claims from
a file), so the demo exercises exactly the code kubelet talks to.
"""

import asyncio
import gc
import os
import signal
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import structlog

# kube_api before anything imports `kubernetes`: it keeps the client's package __init__ files
# (the whole synchronous client and more, about 11 MiB) from running.
from dra_driver import kube_api
from dra_driver.boot_id import current_boot_id
from dra_driver.claims import cdi
from dra_driver.claims.cdi_files import CdiSpecDirectory
from dra_driver.claims.driver_root import (
    DriverDiscovery,
    common_edits,
    control_device_nodes,
    device_root,
    discover_driver,
)
from dra_driver.claims.engine import ClaimEngine, SharingControls
from dra_driver.claims.gpu_edits import DeviceEdits, NvmlEdits, SimulatedEdits
from dra_driver.claims.mps import NvidiaMps, SimulatedMps
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.source import ApiServerClaimSource, ClaimSource
from dra_driver.claims.vgpu_edits import HamiCore, enforcement_off_message
from dra_driver.config_reports import PostEvent, ProblemReporter
from dra_driver.devices.config_files import ConfigChoice
from dra_driver.devices.inventory import Inventory, build_inventory, node_inventory
from dra_driver.devices.node_config import GpuPlan, NodeConfigError
from dra_driver.group_commit import GroupCommitter
from dra_driver.hardware.backend import HardwareBackend
from dra_driver.hardware.health_events import HealthEventSource, SimulatedEvents
from dra_driver.hardware.model import Gpu, HardwareError
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.time_slicing import NvidiaSmiTimeSlicer, SimulatedTimeSlicer
from dra_driver.health.census import device_labels
from dra_driver.health.model import NodeHealth
from dra_driver.health.monitor import HealthMonitor
from dra_driver.health.simulated_faults import apply_pending_faults, open_inbox
from dra_driver.health.taints import tainted_inventory
from dra_driver.kubeconfig import load_kubeconfig
from dra_driver.metrics import AgentMetrics
from dra_driver.node_config_files import load_node_config
from dra_driver.node_configs import NamedConfigs, gpus_in_use, replan
from dra_driver.node_watch import NodeApi, NodeFacts, follow_node
from dra_driver.observability import ObservabilityServer, Readiness, keep_heartbeat
from dra_driver.plugin.server import KubeletPluginServer
from dra_driver.plugin.sockets import SocketPathError
from dra_driver.publish.capabilities import ApiFeature, fall_back
from dra_driver.publish.controller import ResourceSliceController
from dra_driver.publish.diff import Write
from dra_driver.publish.dry_run import print_writes
from dra_driver.publish.slice_api import ApiCallError, SliceApi
from dra_driver.settings import HardwareSpec, InventorySettings, NodeSettings
from dra_driver.shared_locks import exclusive, open_lock_file, try_exclusive

log = structlog.get_logger("dra_driver.node")

# How often injected faults and simulated XIDs are picked up.
HEALTH_POLL_SECONDS = 0.5

# Concurrent claim GETs share one connection pool; kubelet may prepare many pods at once.
API_CONNECTION_POOL_SIZE = 32


class StartupError(RuntimeError):
    """The agent cannot start; the message is the one line an operator needs."""


class SetupError(StartupError):
    """The options describe a node that cannot be (an unknown simulated profile, a node config
    that does not fit the GPUs): the operator's input is wrong, so commands exit 2, not 1."""


# Where the simulated backend keeps its MIG instances, so they outlive a restart of the agent
# as they would on a real GPU.
SIMULATED_HARDWARE_STATE = "simulated-hardware.json"
# Held by the one agent process on the node that publishes the ResourceSlices.
PUBLISHER_LOCK = "publisher.lock"
# How soon a waiting agent notices that the publishing one has stopped.
PUBLISHER_POLL_SECONDS = 0.2


def open_hardware(
    spec: HardwareSpec,
    node_name: str,
    state_dir: Path | None = None,
    driver_root: Path = Path("/"),
    sysfs_root: Path = Path("/sys"),
) -> HardwareBackend:
    if spec.kind == "nvml":
        from dra_driver.hardware.nvml import NvmlBackend  # noqa: PLC0415 - pynvml only where asked for

        return NvmlBackend(sysfs_root / "bus" / "pci" / "devices", driver_root)
    from dra_driver.hardware.simulated_nodes import resolve_node_spec  # noqa: PLC0415

    state_file = state_dir / SIMULATED_HARDWARE_STATE if state_dir is not None else None
    return SimulatedBackend(node_name, resolve_node_spec(spec.source), state_file)


def edits_for(spec: HardwareSpec, proc_root: Path = Path("/proc"), dev_root: Path = Path("/")) -> DeviceEdits:
    """`dev_root`: the host directory whose dev/ holds the GPUs' device nodes (see device_root)."""
    return NvmlEdits(proc_root=proc_root, dev_root=dev_root) if spec.kind == "nvml" else SimulatedEdits()


def driver_files(settings: NodeSettings, gpus: Sequence[Gpu]) -> DriverDiscovery:
    version = gpus[0].driver_version if gpus and gpus[0].driver_version else "unknown"
    discovery = discover_driver(settings.driver_root, version)
    for missing in discovery.missing:
        log.warning(
            "driver file not found under the driver root", file=missing, root=str(settings.driver_root)
        )
    return discovery


def write_common_spec(
    settings: NodeSettings, discovery: DriverDiscovery | None, cdi_specs: CdiSpecDirectory
) -> tuple[str, ...]:
    """On real GPUs, the node-wide CDI spec (control device nodes, driver libraries and tools
    found under the driver root); its device ID goes with every prepared device. Simulated GPUs
    need none."""
    if discovery is None:
        return ()
    nodes = control_device_nodes(device_root(settings.driver_root, settings.host_root))
    cdi_specs.write_node_spec(common_edits(discovery, nodes, settings.host_root))
    return (cdi.common_device_id(settings.driver_name),)


def hami_core(settings: NodeSettings, inventory: Inventory) -> HamiCore | None:
    if settings.hami_core_library is not None:
        return HamiCore(PurePosixPath(settings.hami_core_library), PurePosixPath(settings.hami_core_dir))
    vgpu_gpus = [plan.gpu for plan in inventory.plans if plan.mode.startswith("vgpu-")]
    if vgpu_gpus:
        log.warning(enforcement_off_message(vgpu_gpus))
    return None


def sharing_controls(
    settings: NodeSettings, gpus: Sequence[Gpu], discovery: DriverDiscovery | None
) -> SharingControls:
    if discovery is None:
        return SharingControls(SimulatedTimeSlicer(gpu.uuid for gpu in gpus), SimulatedMps(settings.mps_dir))
    return SharingControls(NvidiaSmiTimeSlicer(discovery), NvidiaMps(discovery, settings.mps_dir))


async def kubernetes_api_client(kubeconfig: Path | None) -> kube_api.KubeClient:
    configuration = kube_api.Configuration()
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
    try:
        if kubeconfig is not None:
            await load_kubeconfig(kubeconfig, configuration)
        else:
            kube_api.load_incluster_config(client_configuration=configuration)
    except (kube_api.ConfigException, OSError, ValueError) as error:
        raise StartupError(f"{where}: cannot load Kubernetes client configuration: {error}") from error
    configuration.connection_pool_maxsize = API_CONNECTION_POOL_SIZE
    # With trust_env, aiohttp reads ~/.netrc and scans the whole environment for proxies on every
    # request, through two thread hops: a third of each claim GET. The proxy is found once here.
    configuration.proxy = configuration.proxy or environment_proxy(configuration.host)
    configuration.client_session_kwargs = {**(configuration.client_session_kwargs or {}), "trust_env": False}
    try:
        return kube_api.KubeClient(configuration)  # reads the CA and client certificate files
    except OSError as error:  # ssl.SSLError included
        raise StartupError(f"{where}: cannot set up TLS for the Kubernetes API: {error}") from error


def environment_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY name for `url`, unless NO_PROXY exempts its host."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


async def discover_gpus(
    settings: InventorySettings, state_dir: Path | None = None
) -> tuple[HardwareBackend, tuple[Gpu, ...]]:
    """The hardware, opened, and its GPUs as they are at start."""
    try:
        hardware = open_hardware(
            settings.hardware, settings.node_name, state_dir, settings.driver_root, settings.sysfs_root
        )
        return hardware, tuple(await hardware.discover())
    except HardwareError as error:
        # A simulated node is the operator's description; real GPUs failing are a run-time matter.
        failure = SetupError if settings.hardware.kind == "simulated" else StartupError
        raise failure(f"--hardware {settings.hardware}: {error}") from error


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


@dataclass
class NodeAgent:
    settings: NodeSettings
    hardware: HardwareBackend
    inventory: Inventory
    engine: ClaimEngine
    server: KubeletPluginServer
    metrics: AgentMetrics
    readiness: Readiness
    publisher: ResourceSliceController | None = None
    health: HealthMonitor | None = None
    # Every GPU found at start, offered or not: what node configs are planned against.
    gpus: tuple[Gpu, ...] = ()
    reporter: ProblemReporter | None = None
    # The plan each GPU was last offered under (by UUID): what its prepared claims expect. None
    # until this process offers something: claims of an earlier run cannot be told apart.
    offered: dict[str, GpuPlan] | None = None
    # What the slices should say now (health taints included), kept while a peer publishes.
    _wanted_slices: Inventory | None = None
    _publishing: "asyncio.Task[None] | None" = None
    _health_tasks: tuple["asyncio.Task[None]", ...] = ()

    @classmethod
    async def start(
        cls,
        settings: NodeSettings,
        claim_source: ClaimSource,
        slice_api: SliceApi | None = None,
        metrics: AgentMetrics | None = None,
        readiness: Readiness | None = None,
        node_api: NodeApi | None = None,
    ) -> "NodeAgent":
        """`slice_api` None: no cluster (the demo), so nothing is published. `node_api`: where
        the Node's labels are read, which --node-configs needs in a cluster."""
        metrics = metrics or AgentMetrics()
        readiness = readiness or Readiness()
        hardware, all_gpus = await discover_gpus(settings.inventory, settings.state_dir)
        choice = initial_config(settings)
        first = replan(choice, all_gpus, None, frozenset(), frozenset())
        inventory = build_inventory(first.plans)
        log.info(
            "hardware discovered",
            hardware=hardware.description,
            pool=settings.node_name,
            devices=[device.name for device in inventory.devices],
        )
        for note in inventory.notes:
            log.warning("device left out", note=note)
        cdi_specs = CdiSpecDirectory(settings.cdi_dir, settings.driver_name)
        # Durable record writes of concurrent claims share one flush.
        committer = GroupCommitter()
        gpus = all_gpus
        try:
            discovery = (
                await asyncio.to_thread(driver_files, settings, gpus)
                if settings.hardware.kind == "nvml"
                else None
            )
            common_cdi_ids = await asyncio.to_thread(write_common_spec, settings, discovery, cdi_specs)
            sharing = sharing_controls(settings, gpus, discovery)
        except HardwareError as error:  # a driver program missing from the driver root
            await hardware.close()
            raise StartupError(f"--driver-root {settings.driver_root}: {error}") from error
        except (OSError, ValueError) as error:
            await hardware.close()
            raise StartupError(f"cannot write the node's CDI spec in {settings.cdi_dir}: {error}") from error
        engine = ClaimEngine(
            driver_name=settings.driver_name,
            pool_name=settings.node_name,
            inventory=inventory,
            edits=edits_for(
                settings.hardware,
                settings.proc_root,
                device_root(settings.driver_root, settings.host_root).host,
            ),
            claim_source=claim_source,
            records=ClaimRecordStore(settings.state_dir, committer),
            cdi_specs=cdi_specs,
            hardware=hardware,
            common_cdi_ids=common_cdi_ids,
            sharing=sharing,
            hami_core=hami_core(settings, inventory),
            metrics=metrics.claims,
        )
        try:
            for quarantined in await engine.load_state(current_boot_id()):
                log.error(
                    "unreadable claim record set aside",
                    path=str(quarantined.path),
                    problem=quarantined.problem,
                )
            server = KubeletPluginServer(
                driver_name=settings.driver_name,
                registration_socket=settings.registration_socket,
                dra_socket=settings.dra_socket,
                engine=engine,
            )
            await server.start()
        except (OSError, SocketPathError) as error:
            engine.close()
            await hardware.close()
            raise StartupError(str(error)) from error
        log.info(
            "claims restored from state",
            prepared_claims=len(engine.prepared_claims),
            state_dir=str(settings.state_dir),
        )
        reporter = ProblemReporter(
            settings.node_name, metrics, None if slice_api is None else _event_poster(slice_api)
        )
        agent = cls(
            settings=settings,
            hardware=hardware,
            inventory=inventory,
            engine=engine,
            server=server,
            metrics=metrics,
            readiness=readiness,
            gpus=all_gpus,
            offered=None if settings.node_configs else {plan.gpu.uuid: plan for plan in first.plans},
            reporter=reporter,
        )
        reporter.report(choice, first.problems, ())
        metrics.set_devices(device_labels(inventory, NodeHealth(settings.node_name)))
        agent.start_health_monitor()
        if settings.node_configs is not None:
            agent.follow_named_configs(settings.node_configs, slice_api, node_api)
        elif slice_api is not None:
            agent.start_publishing(slice_api)
        if slice_api is None:
            readiness.published(True)  # no cluster: nothing to publish
        agent._health_tasks += (asyncio.create_task(agent._follow_registration(), name="registration"),)
        return agent

    # -- node configs changing while the agent runs ---------------------------------------------

    def follow_named_configs(
        self, directory: Path, slice_api: SliceApi | None, node_api: NodeApi | None
    ) -> None:
        """The Node's label picks the config. Publishing starts once the label was read: until
        then the node's config is unknown, and publishing any other would offer modes nobody
        asked for (and an empty pool would take the node's devices away)."""
        named = NamedConfigs(directory, self.settings.node_config_label, self._use_config)
        tasks = [asyncio.create_task(named.poll_forever(), name="node-config-files")]
        if node_api is None:
            named.without_node()
        else:

            def node_changed(facts: NodeFacts) -> None:
                named.node_changed(facts)
                if self._publishing is None and slice_api is not None:
                    self.start_publishing(slice_api)

            tasks.append(asyncio.create_task(follow_node(node_api, node_changed), name="node-watch"))
        self._health_tasks += tuple(tasks)

    def _use_config(self, choice: ConfigChoice) -> bool:
        """Re-plans every GPU under `choice`; answers whether GPUs wait for their claims."""
        result = replan(
            choice,
            self.gpus,
            self.offered,
            gpus_in_use(self.engine.prepared_claims.values(), self.gpus),
            self.publisher.status.unsupported if self.publisher is not None else frozenset(),
        )
        if self.reporter is not None:
            self.reporter.report(choice, result.problems, result.waiting)
        if result.plans != self.inventory.plans:
            log.info(
                "node config applied",
                config=choice.origin,
                gpus={plan.gpu.index: plan.mode for plan in result.plans},
            )
            self._use_inventory(build_inventory(result.plans))
        return bool(result.waiting)

    def _use_inventory(self, inventory: Inventory) -> None:
        """Publishing and preparing from now on; health taints stay on the GPUs that have them."""
        self.inventory = inventory
        self._offer(inventory.plans)
        self.engine.use_inventory(inventory)
        for note in inventory.notes:
            log.warning("device left out", note=note)
        if self.health is None:
            self._publish(inventory)
            self.metrics.set_devices(device_labels(inventory, NodeHealth(self.settings.node_name)))
            return
        self.health.republish()
        self._health_changed(self.health.node_health)

    def _offer(self, plans: Sequence[GpuPlan]) -> None:
        self.offered = {**(self.offered or {}), **{plan.gpu.uuid: plan for plan in plans}}

    async def _follow_registration(self) -> None:
        registration = self.server.registration
        while True:
            await registration.status_changed.wait()
            registration.status_changed.clear()
            registered = registration.status is not None and registration.status.registered
            self.readiness.registered(registered)
            self.metrics.kubelet_registered.set(int(registered))

    async def _follow_publishing(self, publisher: ResourceSliceController) -> None:
        """Ready once the slices were published the first time; later republishing (a fault, a
        fallback) does not make the node unready."""
        await publisher.status.converged.wait()
        self.readiness.published(True)

    def _health_changed(self, health: NodeHealth) -> None:
        self.server.health.update(health)
        self.metrics.set_devices(device_labels(self.inventory, health))

    def start_health_monitor(self) -> None:
        """XIDs and lost GPUs become taints on the published devices and the kubelet health
        stream; a simulated node also takes faults from `dra-driver simulate-fault`."""
        tasks = []
        if isinstance(self.hardware, SimulatedBackend):
            source: HealthEventSource = SimulatedEvents(self.hardware, HEALTH_POLL_SECONDS)
            # Before the agent says it runs, so that a fault sent once it does is always taken.
            open_inbox(self.settings.state_dir, self._simulated_gpus())
            tasks.append(asyncio.create_task(self._take_simulated_faults(self.hardware), name="fault-inbox"))
        else:
            from dra_driver.hardware.nvml_events import NvmlEvents  # noqa: PLC0415 - pynvml only on GPUs

            source = NvmlEvents(known_gpus={plan.gpu.index: plan.gpu.uuid for plan in self.inventory.plans})
        self.health = HealthMonitor(
            source,
            driver_name=self.settings.driver_name,
            pool=self.settings.node_name,
            untainted=lambda: self.inventory,
            publish=self._publish,
            on_health=self._health_changed,
            layout=lambda: (self.publisher.status.layout if self.publisher else None) or "1.35",
            policy=self.settings.xid_policy,
            recovery_seconds=self.settings.health_recovery_seconds,
        )
        tasks.append(asyncio.create_task(self.health.run(), name="health-monitor"))
        self._health_tasks += tuple(tasks)

    def _simulated_gpus(self) -> dict[str, str]:
        return {str(gpu.index): gpu.uuid for gpu in self.gpus}

    async def _take_simulated_faults(self, hardware: SimulatedBackend) -> None:
        gpus = self._simulated_gpus()
        while True:
            await asyncio.to_thread(apply_pending_faults, self.settings.state_dir, hardware, gpus)
            await asyncio.sleep(HEALTH_POLL_SECONDS)

    def _publish(self, inventory: Inventory) -> None:
        self._wanted_slices = inventory
        if self.publisher is not None:
            self.publisher.set_inventory(inventory)

    def start_publishing(self, slice_api: SliceApi) -> None:
        self._publishing = asyncio.create_task(self._publish_once_first(slice_api), name="resourceslices")

    async def _publish_once_first(self, slice_api: SliceApi) -> None:
        """One agent per node publishes: while the old and the new pod of a rolling update
        overlap, two controllers would each repair the other's slices. The one holding the
        node's publisher lock publishes; the other counts as published (its peer's slices
        describe the same GPUs) and takes over, adopting the slices as they are, once the peer
        has stopped."""
        fd = open_lock_file(self.settings.state_dir / PUBLISHER_LOCK)
        try:
            if not try_exclusive(fd):
                log.info("another agent on this node publishes the ResourceSlices; taking over when it stops")
                self.readiness.published(True)
                await exclusive(fd, longest_poll=PUBLISHER_POLL_SECONDS)
                log.info("taking over publishing the ResourceSlices")
            dry_run: Callable[[tuple[Write, ...]], None] | None = (
                print_writes if self.settings.dry_run else None
            )
            self.publisher = ResourceSliceController(
                slice_api,
                self.settings.driver_name,
                self.settings.node_name,
                self._wanted_slices or self.inventory,
                sync_delay=self.settings.sync_delay,
                fall_back=self._fall_back,
                metrics=self.metrics.publish,
                dry_run=dry_run,
            )
            self._health_tasks += (
                asyncio.create_task(self._follow_publishing(self.publisher), name="published"),
            )
            await self.publisher.run()
        finally:
            os.close(fd)

    def _fall_back(self, unsupported: frozenset[ApiFeature]) -> Inventory | None:
        """Re-plans every GPU in modes the API server can store, for publishing and preparing alike."""
        plans, notes = fall_back(self.inventory.plans, unsupported)
        if plans == self.inventory.plans:
            return None
        for note in notes:
            log.warning("GPU offered differently: the API server lacks a feature", note=note)
        self.inventory = build_inventory(plans)
        self._offer(plans)
        self.engine.use_inventory(self.inventory)
        if self.health is None:
            return self.inventory
        self._health_changed(self.health.node_health)
        return tainted_inventory(self.inventory, self.health.state, self.settings.driver_name, "1.35")

    async def stop(self) -> None:
        """Leaves the published slices in place: kubelet removes them once the plugin is gone
        for good, and a restarting agent takes them over without a gap."""
        self.readiness.registered(False)  # /readyz fails while in-flight calls finish
        self.metrics.kubelet_registered.set(0)
        for task in (*self._health_tasks, self._publishing):
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._health_tasks, return_exceptions=True)
        if self._publishing is not None:
            await asyncio.gather(self._publishing, return_exceptions=True)
        await self.server.stop()
        self.engine.close()
        await self.hardware.close()
        if self.reporter is not None:
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
        except ApiCallError as error:
            log.warning("could not post the Event on the Node", reason=reason, error=str(error))

    return post


def _termination_signal() -> "asyncio.Future[signal.Signals]":
    """A future set by the first SIGTERM or SIGINT; installed before anything starts, so a
    signal during start-up still ends in an orderly stop."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(signum: signal.Signals) -> None:
        if not received.done():
            received.set_result(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    return received


async def run_node(settings: NodeSettings) -> None:
    termination = _termination_signal()
    api_client = await kubernetes_api_client(settings.kubeconfig)
    metrics, readiness = AgentMetrics(), Readiness()
    heartbeat = asyncio.create_task(keep_heartbeat(readiness), name="heartbeat")
    endpoint = None
    try:
        if settings.hardware.kind == "nvml":
            # /healthz answers while the agent waits for the driver: waiting is not a failure.
            endpoint = await wait_for_driver(settings, metrics, readiness)
        slice_api = SliceApi(api_client, settings.driver_name, settings.node_name)
        agent = await NodeAgent.start(
            settings,
            ApiServerClaimSource(api_client),
            slice_api,
            metrics,
            readiness,
            NodeApi(api_client, settings.node_name),
        )
        try:
            # After the start, so a start that fails says so in exactly one line.
            endpoint = endpoint or start_observability(settings, metrics, readiness)
        except StartupError:
            await agent.stop()
            raise
        # What start-up built (modules, catalog, inventory) lives as long as the agent: out of the
        # collector's way, each collection walks only what calls allocate.
        gc.freeze()
        log.info("node agent running", node=settings.node_name, driver=settings.driver_name, pid=os.getpid())
        received = await termination
        log.info("stopping after signal; in-flight calls finish first", signal=received.name)
        await agent.stop()
    finally:
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
        if endpoint is not None:
            await asyncio.to_thread(endpoint.stop)
        await api_client.close()


async def wait_for_driver(
    settings: NodeSettings, metrics: AgentMetrics, readiness: Readiness
) -> ObservabilityServer | None:
    """Returns at once where the NVIDIA library loads; otherwise serves the probes while it waits
    for the driver to appear under the driver root, and returns the running endpoint."""
    from dra_driver.hardware.nvml_library import NvmlLibraryNotFound, load_nvml_library  # noqa: PLC0415
    from dra_driver.hardware.nvml_wait import wait_for_nvml_library  # noqa: PLC0415

    try:
        await asyncio.to_thread(load_nvml_library, settings.driver_root)
    except NvmlLibraryNotFound:
        endpoint = start_observability(settings, metrics, readiness)
        await wait_for_nvml_library(settings.driver_root)
        return endpoint
    return None


def start_observability(
    settings: NodeSettings, metrics: AgentMetrics, readiness: Readiness
) -> ObservabilityServer | None:
    if settings.metrics_address is None:
        return None
    endpoint = ObservabilityServer(settings.metrics_address, metrics.registry, readiness)
    try:
        endpoint.start()
    except OSError as error:
        raise StartupError(f"--metrics-address {settings.metrics_address}: cannot listen: {error}") from error
    return endpoint
