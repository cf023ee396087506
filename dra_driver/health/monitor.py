"""The health monitor: GPU events in, health states out.

It owns the health state and is the only writer of it. Each event (an XID, a lost GPU) and each
recovery deadline produces the new state (pure `tracker` functions); whenever the state changes,
it is handed on with its cause. What a state means for the slices (taints) and for the kubelet
health stream is decided by whoever receives it, from the inventory of the moment.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from dra_driver.hardware.events import HealthEvent
from dra_driver.hardware.health_events import HealthEventSource
from dra_driver.health.model import HealthStatus, NodeHealth
from dra_driver.health.tracker import HealthState, apply, next_change_at, settle
from dra_driver.health.xid import XidPolicy

log = structlog.get_logger("dra_driver.health")

DEFAULT_RECOVERY_SECONDS = 300.0

# Told each new state and what caused it (the event's type name, or "recovery").
HealthChange = Callable[[HealthState, str], None]


class HealthMonitor:
    def __init__(
        self,
        source: HealthEventSource,
        *,
        on_change: HealthChange,
        policy: XidPolicy,
        recovery_seconds: float = DEFAULT_RECOVERY_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._on_change = on_change
        self._policy = policy
        self._recovery_seconds = recovery_seconds
        self._clock = clock
        self.state = HealthState(started_at=clock())

    async def run(self) -> None:
        """Until cancelled: starts the source, then follows its events and recovery deadlines."""
        self._source.start()
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

    def _change(self, state: HealthState, cause: str) -> None:
        if state != self.state:
            self.state = state
            self._on_change(state, cause)


def log_change(health: NodeHealth, cause: str) -> None:
    """One line per change, a warning while any device is unhealthy."""
    unhealthy = sorted(
        name for name, device in health.devices.items() if device.status is HealthStatus.UNHEALTHY
    )
    if unhealthy:
        log.warning("device health changed", cause=cause, pool=health.pool, unhealthy_devices=unhealthy)
    else:
        log.info("device health changed", cause=cause, pool=health.pool, unhealthy_devices=[])
