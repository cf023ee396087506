"""The health of each GPU: a pure state machine over XID events, lost GPUs and the passage of time.

Pure so that every transition can be tested without hardware or clocks, and so that what the agent
publishes (taints, the kubelet health stream) is a function of one value. The agent owns the state:
for each event it first settles the state at the event's time and then applies the event, and it
wakes up at `next_change_at` to settle again, so a GPU recovers on time even when nothing happens.

A GPU recovers once it has gone `recovery_seconds` without a fault that counts (ignored XIDs do
not): drivers report no "fixed" event, and a GPU that was reset, or whose fault was transient,
simply stops reporting. A lost GPU (fallen off the bus) never recovers: only a reboot or driver
reload brings it back, and the agent restarts with a fresh state then.

The MPS control daemons of vGPU shares are a second input, not events of this state machine: a
dead daemon is not a fault of the GPU (it neither decays with time nor taints the devices, and
it ends when the daemon answers again), and it concerns only the devices of the shares prepared
on the GPU. So it stays a separate pure value (health.mps_daemons) that `node_health` joins in
when it builds what the kubelet stream reports, and the taints never see it.
"""

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import msgspec
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.events import GpuLost, HealthEvent, XidEvent
from dra_driver.health.model import DeviceHealth, HealthStatus, NodeHealth
from dra_driver.health.mps_daemons import DaemonState, GpuDaemons, down_message
from dra_driver.health.xid import XID_DESCRIPTIONS, XidClass, XidPolicy

# What the kubelet health stream carries per device at most.
MESSAGE_LIMIT = 1024


class SeenXid(msgspec.Struct, frozen=True):
    xid: int
    xid_class: XidClass
    # The last time the GPU reported it.
    last_at: float


class GpuCondition(msgspec.Struct, frozen=True):
    """One GPU as the tracker sees it; without faults and not lost, it is healthy."""

    # When `status` last changed (or tracking started).
    since: float
    # The XIDs that counted since the GPU was last healthy: worst first, then by number.
    faults: tuple[SeenXid, ...] = ()
    lost_at: float | None = None

    @property
    def worst(self) -> XidClass | None:
        if self.lost_at is not None:
            return XidClass.FATAL
        return self.faults[0].xid_class if self.faults else None

    @property
    def status(self) -> HealthStatus:
        """Informational faults leave the GPU healthy: it works, and kubelet should say so."""
        worst = self.worst
        return (
            HealthStatus.UNHEALTHY
            if worst is not None and worst >= XidClass.DEGRADED
            else HealthStatus.HEALTHY
        )


class HealthState(msgspec.Struct, frozen=True):
    # When tracking started: GPUs that never had a fault have been healthy since then.
    started_at: float
    # Every GPU that had a fault since tracking started, by UUID.
    gpus: Mapping[str, GpuCondition] = msgspec.field(default_factory=dict)

    def condition(self, gpu_uuid: str) -> GpuCondition:
        return self.gpus.get(gpu_uuid) or GpuCondition(since=self.started_at)


def _with_fault(faults: Iterable[SeenXid], seen: SeenXid) -> tuple[SeenXid, ...]:
    by_xid = {fault.xid: fault for fault in faults}
    if earlier := by_xid.get(seen.xid):
        seen = replace(seen, last_at=max(seen.last_at, earlier.last_at))
    by_xid[seen.xid] = seen
    return tuple(sorted(by_xid.values(), key=lambda fault: (-fault.xid_class, fault.xid)))


def apply(state: HealthState, event: HealthEvent, policy: XidPolicy) -> HealthState:
    """The state after `event`. Settle the state at the event's time first (see the module doc):
    faults of a GPU that has recovered meanwhile would otherwise count against it again."""
    before = state.condition(event.gpu_uuid)
    match event:
        case GpuLost():
            after = replace(before, lost_at=event.at if before.lost_at is None else before.lost_at)
        case XidEvent():
            xid_class = policy.classify(event.xid)
            if xid_class is XidClass.IGNORED:
                return state
            after = replace(
                before, faults=_with_fault(before.faults, SeenXid(event.xid, xid_class, event.at))
            )
    if after.status is not before.status:
        after = replace(after, since=event.at)
    return replace(state, gpus={**state.gpus, event.gpu_uuid: after})


def _recovery_at(condition: GpuCondition, recovery_seconds: float) -> float | None:
    if condition.lost_at is not None or not condition.faults:
        return None
    return max(fault.last_at for fault in condition.faults) + recovery_seconds


def settle(state: HealthState, now: float, recovery_seconds: float) -> HealthState:
    """The state at `now`: every GPU whose last fault is `recovery_seconds` old or older is healthy
    again, as of exactly that moment, and its faults are forgotten."""
    settled = {}
    for gpu_uuid, condition in state.gpus.items():
        recovered_at = _recovery_at(condition, recovery_seconds)
        if recovered_at is None or recovered_at > now:
            settled[gpu_uuid] = condition
        elif condition.status is HealthStatus.HEALTHY:
            settled[gpu_uuid] = GpuCondition(since=condition.since)
        else:
            settled[gpu_uuid] = GpuCondition(since=recovered_at)
    return state if settled == state.gpus else replace(state, gpus=settled)


def next_change_at(state: HealthState, recovery_seconds: float) -> float | None:
    """When `settle` will next change something, or None while no GPU is due to recover."""
    due = (_recovery_at(condition, recovery_seconds) for condition in state.gpus.values())
    return min((at for at in due if at is not None), default=None)


def _timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _xid_name(xid: int) -> str:
    description = XID_DESCRIPTIONS.get(xid)
    return f"XID {xid} ({description})" if description else f"XID {xid}"


def _limited(entries: list[str], limit: int) -> str:
    """The entries joined, as many as fit in `limit` characters, with a count of those left out."""
    shown = len(entries)
    text = ". ".join(entries)
    while len(text) > limit:
        shown -= 1
        text = ". ".join([*entries[:shown], f"and {len(entries) - shown} more"])
    return text


def describe(condition: GpuCondition) -> str:
    """Why the GPU is in its condition, worst first: 'XID 48 (double-bit ECC error) at
    2026-11-21T10:00:00Z; fatal', at most MESSAGE_LIMIT characters; empty when it has no faults."""
    entries = []
    if condition.lost_at is not None:
        entries.append(f"GPU lost (fell off the bus) at {_timestamp(condition.lost_at)}; fatal")
    entries += [
        f"{_xid_name(fault.xid)} at {_timestamp(fault.last_at)}; {fault.xid_class.label}"
        for fault in condition.faults
    ]
    return _limited(entries, MESSAGE_LIMIT)


def _with_daemon(health: DeviceHealth, gpu_uuid: str, daemon: DaemonState | None) -> DeviceHealth:
    """A share's device: unhealthy while its GPU's MPS daemon is down, whatever the GPU's own
    condition, with both reasons; healthy again (if the GPU is) as of the daemon's return."""
    if daemon is None:
        return health
    if not daemon.down:
        if health.status is HealthStatus.HEALTHY:
            return replace(health, since=max(health.since, daemon.since))
        return health
    since = daemon.since if health.status is HealthStatus.HEALTHY else min(health.since, daemon.since)
    reasons = [down_message(gpu_uuid, daemon), *([health.message] if health.message else [])]
    return DeviceHealth(HealthStatus.UNHEALTHY, since, _limited(reasons, MESSAGE_LIMIT))


def node_health(
    state: HealthState, inventory: Inventory, pool: str, daemons: GpuDaemons | None = None
) -> NodeHealth:
    """The health of every device of the inventory; the devices of a GPU share its health, and
    the devices of its vGPU shares also depend on its MPS daemon (`daemons`)."""
    of_gpu: dict[str, DeviceHealth] = {}
    devices = {}
    for device in inventory.devices:
        gpu_uuid = inventory.gpu_of_device[device.name].uuid
        if gpu_uuid not in of_gpu:
            condition = state.condition(gpu_uuid)
            of_gpu[gpu_uuid] = DeviceHealth(condition.status, condition.since, describe(condition))
        daemon = None if daemons is None else daemons.affecting(gpu_uuid, device.name)
        devices[device.name] = _with_daemon(of_gpu[gpu_uuid], gpu_uuid, daemon)
    return NodeHealth(pool=pool, devices=devices)
