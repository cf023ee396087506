"""The GPU health state machine: transitions, recovery, lost GPUs and what it tells kubelet."""

from dataclasses import dataclass, field
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.events import GpuLost, HealthEvent, XidEvent
from dra_driver.health.model import DeviceHealth, HealthStatus
from dra_driver.health.taints import tainted_inventory
from dra_driver.health.tracker import (
    MESSAGE_LIMIT,
    GpuCondition,
    HealthState,
    SeenXid,
    apply,
    describe,
    next_change_at,
    node_health,
    settle,
)
from dra_driver.health.xid import DEFAULT_XID_POLICY, XidClass, parse_xid_policy
from tests.support.nodes import inventory_for

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC).timestamp()
RECOVERY = 600.0
GPU = "GPU-aaaa"
OTHER = "GPU-bbbb"
POLICY = DEFAULT_XID_POLICY


def run(events: list[HealthEvent], started_at: float = T0 - 100) -> HealthState:
    """As the agent does it: settle at each event's time, then apply the event."""
    state = HealthState(started_at=started_at)
    for event in events:
        state = apply(settle(state, event.at, RECOVERY), event, POLICY)
    return state


def test_a_fatal_xid_makes_the_gpu_unhealthy_from_then_on() -> None:
    state = run([XidEvent(GPU, 48, T0)])
    condition = state.condition(GPU)

    assert condition == GpuCondition(since=T0, faults=(SeenXid(48, XidClass.FATAL, T0),))
    assert condition.status is HealthStatus.UNHEALTHY
    assert describe(condition) == "XID 48 (double-bit ECC error) at 2026-11-21T10:00:00Z; fatal"
    assert state.condition(OTHER) == GpuCondition(since=T0 - 100)


def test_an_ignored_xid_changes_nothing() -> None:
    state = run([XidEvent(GPU, 92, T0)])
    assert apply(state, XidEvent(GPU, 13, T0 + 1), POLICY) is state
    assert apply(state, XidEvent(OTHER, 31, T0 + 1), POLICY) is state
    # An ignored XID does not hold off recovery either.
    assert settle(apply(state, XidEvent(GPU, 43, T0 + 599), POLICY), T0 + 600, RECOVERY).condition(
        GPU
    ) == GpuCondition(since=T0 + 600)


def test_an_informational_xid_leaves_the_gpu_healthy_but_says_why() -> None:
    condition = run([XidEvent(GPU, 94, T0)]).condition(GPU)

    assert condition.status is HealthStatus.HEALTHY
    assert condition.since == T0 - 100
    assert describe(condition) == "XID 94 (contained ECC error) at 2026-11-21T10:00:00Z; informational"


def test_the_gpu_is_unhealthy_since_its_first_fault_that_made_it_so() -> None:
    condition = run(
        [
            XidEvent(GPU, 63, T0),
            XidEvent(GPU, 92, T0 + 10),
            XidEvent(GPU, 48, T0 + 20),
            XidEvent(GPU, 92, T0 + 30),
        ]
    ).condition(GPU)

    assert condition.since == T0 + 10
    assert condition.faults == (
        SeenXid(48, XidClass.FATAL, T0 + 20),
        SeenXid(92, XidClass.DEGRADED, T0 + 30),
        SeenXid(63, XidClass.INFORMATIONAL, T0),
    )
    assert describe(condition) == (
        "XID 48 (double-bit ECC error) at 2026-11-21T10:00:20Z; fatal. "
        "XID 92 (high single-bit ECC error rate) at 2026-11-21T10:00:30Z; degraded. "
        "XID 63 (ECC page retirement or row remapping recorded) at 2026-11-21T10:00:00Z; informational"
    )


def test_an_xid_outside_the_catalogue_is_degraded_and_shown_by_number() -> None:
    condition = run([XidEvent(GPU, 200, T0)]).condition(GPU)
    assert condition.status is HealthStatus.UNHEALTHY
    assert describe(condition) == "XID 200 at 2026-11-21T10:00:00Z; degraded"


def test_the_operator_policy_decides_the_class() -> None:
    policy = parse_xid_policy({"ignored": [48], "fatal": [13]})
    state = HealthState(started_at=T0)
    assert apply(state, XidEvent(GPU, 48, T0), policy) is state
    assert apply(state, XidEvent(GPU, 13, T0), policy).condition(GPU).worst is XidClass.FATAL


def test_a_gpu_recovers_exactly_the_recovery_time_after_its_last_fault() -> None:
    state = run([XidEvent(GPU, 92, T0), XidEvent(GPU, 95, T0 + 100), XidEvent(OTHER, 74, T0 + 50)])

    assert next_change_at(state, RECOVERY) == T0 + 650
    assert settle(state, T0 + 649.999, RECOVERY) is state
    after_other = settle(state, T0 + 650, RECOVERY)
    assert after_other.condition(OTHER) == GpuCondition(since=T0 + 650)
    assert after_other.condition(GPU) == state.condition(GPU)
    assert next_change_at(after_other, RECOVERY) == T0 + 700
    # However late the agent wakes up, the GPU was healthy again at exactly that moment.
    recovered = settle(after_other, T0 + 5000, RECOVERY)
    assert recovered.condition(GPU) == GpuCondition(since=T0 + 700)
    assert next_change_at(recovered, RECOVERY) is None
    assert describe(recovered.condition(GPU)) == ""


def test_an_informational_gpu_that_recovers_keeps_its_healthy_since() -> None:
    state = settle(run([XidEvent(GPU, 63, T0)]), T0 + 600, RECOVERY)
    assert state.condition(GPU) == GpuCondition(since=T0 - 100)


def test_a_lost_gpu_never_recovers() -> None:
    state = run(
        [XidEvent(GPU, 92, T0), GpuLost(GPU, T0 + 5), GpuLost(GPU, T0 + 9), XidEvent(GPU, 63, T0 + 10)]
    )
    condition = state.condition(GPU)

    assert condition.lost_at == T0 + 5
    assert (condition.status, condition.since, condition.worst) == (
        HealthStatus.UNHEALTHY,
        T0,
        XidClass.FATAL,
    )
    assert next_change_at(state, RECOVERY) is None
    assert settle(state, T0 + 10**9, RECOVERY) is state
    assert describe(condition).startswith(
        "GPU lost (fell off the bus) at 2026-11-21T10:00:05Z; fatal. XID 92"
    )


def test_a_gpu_lost_while_healthy_is_unhealthy_from_then_on() -> None:
    condition = run([GpuLost(GPU, T0)]).condition(GPU)
    assert (condition.status, condition.since) == (HealthStatus.UNHEALTHY, T0)
    assert describe(condition) == "GPU lost (fell off the bus) at 2026-11-21T10:00:00Z; fatal"


def test_a_long_message_is_cut_to_the_limit_with_a_count_of_the_rest() -> None:
    condition = run([XidEvent(GPU, 1000 + number, T0 + number) for number in range(40)]).condition(GPU)
    message = describe(condition)

    assert len(message) <= MESSAGE_LIMIT
    assert message.startswith("XID 1000 at 2026-11-21T10:00:00Z; degraded. XID 1001 at")
    shown = message.count("XID ")
    assert 10 < shown < 40
    assert message.endswith(f". and {40 - shown} more")


def test_node_health_covers_every_device_and_devices_share_their_gpus_health() -> None:
    inventory = inventory_for("mixed", "vgpu-partitions")
    gpus = sorted({gpu.uuid for gpu in inventory.gpu_of_device.values()})
    state = run([GpuLost(gpus[0], T0), XidEvent(gpus[1], 94, T0 + 1)])

    health = node_health(state, inventory, "node-a")

    assert health.pool == "node-a"
    assert list(health.devices) == [device.name for device in inventory.devices]
    for name, device_health in health.devices.items():
        gpu_uuid = inventory.gpu_of_device[name].uuid
        if gpu_uuid == gpus[0]:
            assert device_health == DeviceHealth(
                HealthStatus.UNHEALTHY, T0, "GPU lost (fell off the bus) at 2026-11-21T10:00:00Z; fatal"
            )
        elif gpu_uuid == gpus[1]:
            assert device_health.status is HealthStatus.HEALTHY
            assert device_health.message.startswith("XID 94 (contained ECC error)")
        else:
            assert device_health == DeviceHealth(HealthStatus.HEALTHY, T0 - 100, "")


# Property tests: random events and time steps on the GPUs of a small node.
NODE: Inventory = inventory_for("t4x4")
NODE_GPUS = sorted({gpu.uuid for gpu in NODE.gpu_of_device.values()})
XIDS = [13, 31, 43, 45, 68, 63, 94, 64, 74, 92, 48, 95, 119, 777]


@dataclass(frozen=True)
class Step:
    kind: str  # "xid", "lost" or "settle"
    gpu: int
    xid: int
    # Seconds after the previous step.
    delay: float


steps = st.lists(
    st.builds(
        Step,
        kind=st.sampled_from(["xid", "xid", "xid", "lost", "settle"]),
        gpu=st.integers(0, len(NODE_GPUS) - 1),
        xid=st.sampled_from(XIDS),
        delay=st.sampled_from([0.0, 1.0, 299.5, RECOVERY - 1, RECOVERY, RECOVERY + 1, 3 * RECOVERY]),
    ),
    max_size=40,
)


@dataclass
class Model:
    """What the tracker should know about one GPU, kept the plain way."""

    last_fault: float | None = None
    lost: bool = False
    xids: set[int] = field(default_factory=set)


def play(script: list[Step]) -> tuple[HealthState, dict[str, Model], float]:
    """Runs the script on the raw functions (settle only when the script says so) and on the model."""
    state, now = HealthState(started_at=0.0), 0.0
    models = {gpu_uuid: Model() for gpu_uuid in NODE_GPUS}
    for step in script:
        now += step.delay
        gpu_uuid = NODE_GPUS[step.gpu]
        model = models[gpu_uuid]
        if step.kind == "settle":
            state = settle(state, now, RECOVERY)
            for each in models.values():
                if not each.lost and each.last_fault is not None and now >= each.last_fault + RECOVERY:
                    each.last_fault, each.xids = None, set()
        elif step.kind == "lost":
            state = apply(state, GpuLost(gpu_uuid, now), POLICY)
            model.lost = True
        else:
            state = apply(state, XidEvent(gpu_uuid, step.xid, now), POLICY)
            if POLICY.classify(step.xid) is not XidClass.IGNORED:
                model.last_fault = now
                model.xids.add(step.xid)
    return state, models, now


@given(steps)
def test_the_tracker_agrees_with_the_model(script: list[Step]) -> None:
    state, models, _ = play(script)
    for gpu_uuid, model in models.items():
        condition = state.condition(gpu_uuid)
        assert {fault.xid for fault in condition.faults} == model.xids
        assert (condition.lost_at is not None) == model.lost
        worst = max((POLICY.classify(xid) for xid in model.xids), default=None)
        assert condition.worst == (XidClass.FATAL if model.lost else worst)


@given(steps)
def test_gpus_with_only_ignored_xids_are_never_tainted_nor_unhealthy(script: list[Step]) -> None:
    state, models, now = play(script)
    quiet = {gpu_uuid for gpu_uuid, model in models.items() if not model.lost and not model.xids}

    for layout in ("1.34", "1.35"):
        tainted = tainted_inventory(NODE, state, "gpu.dra-driver.dev", layout)
        for device in tainted.devices:
            if NODE.gpu_of_device[device.name].uuid in quiet:
                assert device == NODE.device_by_name[device.name]
    for name, health in node_health(settle(state, now, RECOVERY), NODE, "node-a").devices.items():
        if NODE.gpu_of_device[name].uuid in quiet:
            assert (health.status, health.message) == (HealthStatus.HEALTHY, "")


@given(steps)
def test_every_gpu_recovers_exactly_the_recovery_time_after_its_last_fault_unless_lost(
    script: list[Step],
) -> None:
    state, models, now = play(script)
    due = []
    for gpu_uuid, model in models.items():
        if model.lost:
            assert settle(state, now + 100 * RECOVERY, RECOVERY).condition(gpu_uuid).lost_at is not None
            continue
        if model.last_fault is None:
            continue
        recovery = model.last_fault + RECOVERY
        due.append(recovery)
        just_before = settle(state, recovery - 0.25, RECOVERY).condition(gpu_uuid)
        assert just_before == state.condition(gpu_uuid)
        recovered = settle(state, recovery, RECOVERY).condition(gpu_uuid)
        assert recovered.faults == ()
        assert recovered.status is HealthStatus.HEALTHY
        if just_before.status is HealthStatus.UNHEALTHY:
            assert recovered.since == recovery
        else:
            assert recovered.since == just_before.since
    assert next_change_at(state, RECOVERY) == min(due, default=None)


@given(steps, st.floats(0, 10 * RECOVERY))
def test_the_state_is_deterministic(script: list[Step], later: float) -> None:
    first, _, now = play(script)
    second, _, _ = play(list(script))
    assert first == second
    settled = settle(first, now + later, RECOVERY)
    assert settled == settle(second, now + later, RECOVERY)
    assert settle(settled, now + later, RECOVERY) is settled
    assert node_health(first, NODE, "node-a") == node_health(second, NODE, "node-a")
