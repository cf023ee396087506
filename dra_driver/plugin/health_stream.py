"""Device health for kubelet: DRAResourceHealth.NodeWatchResources (KEP-4680), v1alpha1 and v1.

Kubelet keeps one NodeWatchResources call open per plugin instance and takes every response as
the complete list of the driver's devices. It stamps each received device with its own clock and
marks a device Unknown once it has not been refreshed within the device's timeout, so every
stream sends the full list at once, again on every change, and at least every `resend_seconds`
even when nothing changed.
"""

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from types import ModuleType
from typing import Any, Generic, TypeVar

import grpc
import structlog

from dra_driver._proto.dra_health.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from dra_driver._proto.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from dra_driver.health.model import HealthStatus, NodeHealth

log = structlog.get_logger("dra_driver.plugin.health")

# Kubelet's own staleness timeout is 30 s: resending every 10 s leaves room for two lost rounds.
DEFAULT_RESEND_SECONDS = 10.0
# Each device carries its timeout (health_check_timeout_seconds, both packages, Kubernetes >=
# 1.35) as this many resend intervals, so a longer configured interval never lets a healthy
# device turn Unknown between two resends; with the default interval it equals kubelet's 30 s.
TIMEOUT_IN_RESENDS = 3
# DeviceHealth.message limit; kubelet cuts longer ones, we cut them first so what we send is what it shows.
MAX_MESSAGE_CHARS = 1024

T = TypeVar("T")


class LatestValue(Generic[T]):
    """One value that many streams follow: each sees it at once, then after every change.

    Followers never miss a change, and a burst of changes reaches a slow follower as its latest
    value only. `close()` ends every follower, after it has seen the value current at that time.
    Used from the event loop thread only.
    """

    def __init__(self, value: T) -> None:
        self._value = value
        self._closed = False
        self._changed = asyncio.Event()

    @property
    def value(self) -> T:
        return self._value

    def set(self, value: T) -> None:
        self._value = value
        self._wake_followers()

    def close(self) -> None:
        self._closed = True
        self._wake_followers()

    def _wake_followers(self) -> None:
        # Followers wait on the event they took before reading the value; a fresh one for the
        # next change means no follower can skip past a change without waking.
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, heartbeat_seconds: float | None = None) -> AsyncGenerator[T, None]:
        """The current value, then the value after each change, and again after
        `heartbeat_seconds` without one (None: only on change)."""
        while True:
            changed = self._changed
            yield self._value
            if self._closed:
                return
            try:
                async with asyncio.timeout(heartbeat_seconds):
                    await changed.wait()
            except TimeoutError:
                pass


class HealthBroadcaster:
    """The latest health of the node's devices, streamed to every open NodeWatchResources call.

    `update()` must be called from the event loop thread (a checker in a thread hands its result
    over with `loop.call_soon_threadsafe`).
    """

    def __init__(
        self, node_health: NodeHealth | None = None, *, resend_seconds: float = DEFAULT_RESEND_SECONDS
    ) -> None:
        if not resend_seconds > 0:
            raise ValueError(f"resend_seconds must be positive, not {resend_seconds}")
        self.resend_seconds = resend_seconds
        self.health_check_timeout_seconds = math.ceil(TIMEOUT_IN_RESENDS * resend_seconds)
        # Nothing to report yet: an empty list, rather than guessing that every device is healthy.
        self._latest = LatestValue(node_health if node_health is not None else NodeHealth(pool=""))

    @property
    def node_health(self) -> NodeHealth:
        return self._latest.value

    def update(self, node_health: NodeHealth) -> None:
        """Replaces the node's health; every open stream sends it at once."""
        self._latest.set(node_health)

    def close(self) -> None:
        """Ends every open stream (after its latest list) so that a server stop is not held up by
        calls that never end on their own; a call opened afterwards gets one list and ends."""
        self._latest.close()

    def follow(self) -> AsyncGenerator[NodeHealth, None]:
        return self._latest.follow(self.resend_seconds)


def kubelet_message(message: str) -> str:
    """At most MAX_MESSAGE_CHARS characters. Cutting by code point never splits a UTF-8 sequence;
    a lone surrogate (text decoded with surrogateescape) could not be encoded at all and would
    fail the whole response, so it becomes '?'."""
    return message[:MAX_MESSAGE_CHARS].encode("utf-8", "replace").decode("utf-8")


class ResourceHealthServicer:
    """DRAResourceHealth of one API version; v1alpha1 and v1 have the same messages, so the
    servicer only needs to know which generated module to build its responses from."""

    def __init__(self, broadcaster: HealthBroadcaster, pb2: ModuleType) -> None:
        self._broadcaster = broadcaster
        self._pb2 = pb2
        self._api = pb2.DESCRIPTOR.package
        self._statuses = {
            HealthStatus.HEALTHY: pb2.HEALTHY,
            HealthStatus.UNHEALTHY: pb2.UNHEALTHY,
            HealthStatus.UNKNOWN: pb2.UNKNOWN,
        }

    def response(self, node_health: NodeHealth) -> Any:
        """Every device of the node, in name order."""
        pb2 = self._pb2
        return pb2.NodeWatchResourcesResponse(
            devices=[
                pb2.DeviceHealth(
                    device=pb2.DeviceIdentifier(pool_name=node_health.pool, device_name=name),
                    health=self._statuses[health.status],
                    last_updated_time=int(health.since),
                    health_check_timeout_seconds=self._broadcaster.health_check_timeout_seconds,
                    message=kubelet_message(health.message),
                )
                for name, health in sorted(node_health.devices.items())
            ]
        )

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        log.debug("kubelet opened the health stream", api=self._api)
        # aclosing: a call cancelled while its response is being written must not leave the
        # follower suspended until garbage collection.
        try:
            async with aclosing(self._broadcaster.follow()) as updates:
                async for node_health in updates:
                    yield self.response(node_health)
        finally:
            # Also on cancellation: kubelet ends the call when it drops this plugin instance.
            log.debug("health stream ended", api=self._api)


def add_resource_health_services(server: grpc.aio.Server, broadcaster: HealthBroadcaster) -> None:
    v1_grpc.add_DRAResourceHealthServicer_to_server(ResourceHealthServicer(broadcaster, v1_pb2), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
        ResourceHealthServicer(broadcaster, v1alpha1_pb2), server
    )
