"""`dra-driver node` as a process: the signals, the API client, the probe endpoint, and the
agent's start and orderly stop between them.

Apart from `node.py` because none of it is the agent: the demo and the contract tests start a
`NodeAgent` without any of it (no signal handlers, no kubeconfig, no /metrics endpoint). What is
decided here is the process's life: a signal at any moment of the start ends it cleanly, the
probes answer while the agent waits for the driver, and what start-up built is frozen out of the
collector's way once it runs.
"""

import asyncio
import gc
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

from dra_driver.agent.errors import StartupError
from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.agent.node import NodeAgent
from dra_driver.claims.source import ApiServerClaimSource
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.config.settings import NodeSettings
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.node_api import NodeApi
from dra_driver.kube.pod_api import PodApi
from dra_driver.kube.slice_api import SliceApi
from dra_driver.kube.timeouts import TIMEOUTS
from dra_driver.observability.metrics import AgentMetrics
from dra_driver.observability.server import ObservabilityServer, Readiness, keep_heartbeat

log = structlog.get_logger("dra_driver.node")
_Started = TypeVar("_Started")


def _pod_api(settings: NodeSettings, api_client: KubeClient) -> PodApi | None:
    """Where MPS daemon pods are created (--mps-daemons pod, issue 26)."""
    if settings.namespace is None:
        return None
    return PodApi(api_client, settings.namespace, settings.node_name)


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


async def started_unless_stopped(
    starting: Coroutine[Any, Any, _Started], termination: "asyncio.Future[signal.Signals]"
) -> _Started | None:
    """The started agent, or None if a signal came first. Start-up can wait for long (for the
    driver, for ever with a wrong --driver-root), so a signal cancels it wherever it is; each of
    its phases closes what it opened when cancelled, and kubelet's SIGKILL is not needed."""
    task = asyncio.create_task(starting, name="start-up")
    await asyncio.wait((task, termination), return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        try:
            return await task  # an agent if start-up ended before the cancellation reached it
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # run_node itself was cancelled
            return None
    return task.result()


async def run_node(settings: NodeSettings) -> None:
    termination = _termination_signal()
    api_client = await kubernetes_api_client(settings.kubeconfig)
    # The claim GET's connection is made while the agent starts, not in kubelet's first prepare.
    connecting = asyncio.create_task(api_client.open_ahead(), name="claim-get-connection")
    metrics, readiness = AgentMetrics(), Readiness()
    heartbeat = asyncio.create_task(keep_heartbeat(readiness), name="heartbeat")
    endpoint = None
    waiting_for_driver = False

    def serve_probes_while_waiting(waiting: bool) -> None:
        """/healthz answers while the agent waits for the driver: waiting is not a failure."""
        nonlocal endpoint, waiting_for_driver
        waiting_for_driver = waiting
        if waiting:
            endpoint = start_observability(settings, metrics, readiness)

    try:
        slice_api = SliceApi(api_client, settings.driver_name, settings.node_name)
        starting = NodeAgent.start(
            settings,
            ApiServerClaimSource(api_client),
            slice_api,
            metrics,
            readiness,
            NodeApi(api_client, settings.node_name),
            on_driver_wait=serve_probes_while_waiting,
            claim_status=ClaimStatusWriter(
                ClaimApi(api_client, TIMEOUTS.claim_status), settings.driver_name, metrics.claim_status
            ),
            pod_api=_pod_api(settings, api_client),
        )
        agent = await started_unless_stopped(starting, termination)
        if agent is None:
            during = "while waiting for the NVIDIA driver" if waiting_for_driver else "during start-up"
            log.info(f"stopped {during}", signal=termination.result().name)
            return
        try:
            # After the start, so a start that fails says so in exactly one line.
            endpoint = endpoint or start_observability(settings, metrics, readiness)
        except StartupError:
            await agent.stop()
            raise
        # What start-up built (modules, catalog, inventory) lives as long as the agent: out of the
        # collector's way, each collection walks only what calls allocate.
        gc.freeze()
        log.info(
            "node agent running",
            node=settings.node_name,
            driver=settings.driver_name,
            pid=os.getpid(),
            event_loop=type(asyncio.get_running_loop()).__module__,
        )
        received = await termination
        log.info("stopping after signal; in-flight calls finish first", signal=received.name)
        await agent.stop()
    finally:
        connecting.cancel()
        heartbeat.cancel()
        await asyncio.gather(connecting, heartbeat, return_exceptions=True)
        if endpoint is not None:
            await asyncio.to_thread(endpoint.stop)
        await api_client.close()


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
