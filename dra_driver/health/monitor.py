"""The health monitor: GPU events in, tainted devices and device health out.

It owns the health state and is the only writer of it. Each event (an XID, a lost GPU) and each
recovery deadline produces the new state (pure `tracker` functions); whenever the state changes,
the published inventory is re-tainted from the untainted one, and the health of every device is
handed on (to the kubelet health stream and the metrics).
"""

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.slices import SliceLayout
from dra_driver.hardware.events import HealthEvent
from dra_driver.hardware.health_events import HealthEventSource
from dra_driver.health.model import HealthStatus, NodeHealth
from dra_driver.health.taints import tainted_inventory
from dra_driver.health.tracker import HealthState, apply, next_change_at, node_health, settle
from dra_driver.health.xid import XidPolicy

log = structlog.get_logger("dra_driver.health")

DEFAULT_RECOVERY_SECONDS = 300.0


class HealthMonitor:
    def __init__(
        self,
        source: HealthEventSource,
        *,
        driver_name: str,
        pool: str,
        untainted: Callable[[], Inventory],
        publish: Callable[[Inventory], None],
        on_health: Callable[[NodeHealth], None],
        layout: Callable[[], SliceLayout],
        policy: XidPolicy,
        recovery_seconds: float = DEFAULT_RECOVERY_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`untainted`: the inventory as the hardware and node config make it (taints are added
        here, to a fresh copy each time, so a recovered GPU loses them). `publish`: where the
        tainted inventory goes (the ResourceSlice controller)."""
        self._source = source
        self._driver_name = driver_name
        self._pool = pool
        self._untainted = untainted
        self._publish = publish
        self._on_health = on_health
        self._layout = layout
        self._policy = policy
        self._recovery_seconds = recovery_seconds
        self._clock = clock
        self.state = HealthState(started_at=clock())

    @property
    def node_health(self) -> NodeHealth:
        return node_health(self.state, self._untainted(), self._pool)

    async def run(self) -> None:
        """Until cancelled: starts the source, then follows its events and recovery deadlines."""
        self._source.start()
        self._on_health(self.node_health)
        events = aiter(self._source)
        pending: asyncio.Task[HealthEvent] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(events))
                deadline = next_change_at(self.state, self._recovery_seconds)
                timeout = None if deadline is None else max(0.0, deadline - self._clock())
                done, _ = await asyncio.wait({pending}, timeout=timeout)
                if pending in done:
                    try:
                        event = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = None
                    # Settled first, at the event's time: a GPU that had already recovered starts
                    # its new fault afresh instead of inheriting the old XIDs.
                    settled = settle(self.state, event.at, self._recovery_seconds)
                    self._change(apply(settled, event, self._policy), type(event).__name__)
                self._change(settle(self.state, self._clock(), self._recovery_seconds), "recovery")
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
            await self._source.stop()

    def republish(self) -> None:
        """Publishes the current taints on the current inventory (after a fallback replaced it)."""
        self._publish(tainted_inventory(self._untainted(), self.state, self._driver_name, self._layout()))

    def _change(self, state: HealthState, cause: str) -> None:
        if state == self.state:
            return
        self.state = state
        health = self.node_health
        unhealthy = sorted(
            name for name, device in health.devices.items() if device.status is HealthStatus.UNHEALTHY
        )
        if unhealthy:
            log.warning("device health changed", cause=cause, pool=self._pool, unhealthy_devices=unhealthy)
        else:
            log.info("device health changed", cause=cause, pool=self._pool, unhealthy_devices=[])
        self.republish()
        self._on_health(health)
