"""`dra-driver node`: the node agent, wired together from its parts.

The same assembly runs in a cluster (claims from the API server) and in the demo (claims from
a file), so the demo exercises exactly the code kubelet talks to.
"""

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import structlog
from kubernetes.aio import client, config

from dra_driver.claims.cdi import CdiSpecDirectory
from dra_driver.claims.engine import ClaimEngine, EditsForGpu
from dra_driver.claims.gpu_edits import nvml_gpu_edits, simulated_gpu_edits
from dra_driver.claims.records import ClaimRecordStore
from dra_driver.claims.source import ApiServerClaimSource, ClaimSource
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import NodeConfigError, load_node_config
from dra_driver.hardware.backend import HardwareBackend
from dra_driver.hardware.model import HardwareError
from dra_driver.plugin.server import KubeletPluginServer
from dra_driver.plugin.sockets import SocketPathError
from dra_driver.settings import HardwareSpec, InventorySettings, NodeSettings

log = structlog.get_logger("dra_driver.node")

# Concurrent claim GETs share one connection pool; kubelet may prepare many pods at once.
API_CONNECTION_POOL_SIZE = 32


class StartupError(RuntimeError):
    """The agent cannot start; the message is the one line an operator needs."""


def open_hardware(spec: HardwareSpec, node_name: str) -> HardwareBackend:
    if spec.kind == "nvml":
        from dra_driver.hardware.nvml import NvmlBackend  # noqa: PLC0415 - pynvml only where asked for

        return NvmlBackend()
    from dra_driver.hardware.simulated import SimulatedBackend  # noqa: PLC0415
    from dra_driver.hardware.simulated_nodes import resolve_node_spec  # noqa: PLC0415

    return SimulatedBackend(node_name, resolve_node_spec(spec.source))


def edits_for(spec: HardwareSpec) -> EditsForGpu:
    return nvml_gpu_edits if spec.kind == "nvml" else simulated_gpu_edits


async def kubernetes_api_client(kubeconfig: Path | None) -> client.ApiClient:
    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as error:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
        raise StartupError(f"{where}: cannot load Kubernetes client configuration: {error}") from error
    configuration.connection_pool_maxsize = API_CONNECTION_POOL_SIZE
    return client.ApiClient(configuration)


async def discover_inventory(settings: InventorySettings) -> tuple[HardwareBackend, Inventory]:
    """The hardware, opened, and what it offers under the node configuration."""
    try:
        node_config = load_node_config(settings.node_config)
    except NodeConfigError as error:
        raise StartupError(str(error)) from error
    try:
        hardware = open_hardware(settings.hardware, settings.node_name)
        gpus = await hardware.discover()
    except HardwareError as error:
        raise StartupError(f"--hardware {settings.hardware}: {error}") from error
    try:
        inventory = node_inventory(gpus, node_config)
    except NodeConfigError as error:
        await hardware.close()
        origin = settings.node_config or "default settings (no --node-config)"
        raise StartupError(f"node config {origin}: {error}") from error
    return hardware, inventory


@dataclass
class NodeAgent:
    settings: NodeSettings
    hardware: HardwareBackend
    inventory: Inventory
    engine: ClaimEngine
    server: KubeletPluginServer

    @classmethod
    async def start(cls, settings: NodeSettings, claim_source: ClaimSource) -> "NodeAgent":
        hardware, inventory = await discover_inventory(settings.inventory)
        log.info(
            "hardware discovered",
            hardware=hardware.description,
            devices=[device.name for device in inventory.devices],
        )
        for note in inventory.notes:
            log.warning("device left out", note=note)
        engine = ClaimEngine(
            driver_name=settings.driver_name,
            pool_name=settings.node_name,
            inventory=inventory,
            edits_for_gpu=edits_for(settings.hardware),
            claim_source=claim_source,
            records=ClaimRecordStore(settings.state_dir),
            cdi_specs=CdiSpecDirectory(settings.cdi_dir, settings.driver_name),
        )
        try:
            for quarantined in await engine.load_state():
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
            await hardware.close()
            raise StartupError(str(error)) from error
        log.info(
            "claims restored from state",
            prepared_claims=len(engine.prepared_claims),
            state_dir=str(settings.state_dir),
        )
        return cls(settings=settings, hardware=hardware, inventory=inventory, engine=engine, server=server)

    async def stop(self) -> None:
        await self.server.stop()
        await self.hardware.close()


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
    try:
        agent = await NodeAgent.start(settings, ApiServerClaimSource(api_client))
        log.info("node agent running", node=settings.node_name, driver=settings.driver_name, pid=os.getpid())
        received = await termination
        log.info("stopping after signal; in-flight calls finish first", signal=received.name)
        await agent.stop()
    finally:
        await api_client.close()
