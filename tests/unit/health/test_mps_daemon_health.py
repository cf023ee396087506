"""Device health from the GPUs' MPS daemons: the pure input beside the XID state (health.mps_daemons)
and how `node_health` joins it in."""

from datetime import UTC, datetime

from dra_driver.hardware.events import XidEvent
from dra_driver.health.model import DeviceHealth, HealthStatus
from dra_driver.health.mps_daemons import DaemonState, GpuDaemons, down_message
from dra_driver.health.tracker import MESSAGE_LIMIT, HealthState, apply, node_health
from dra_driver.health.xid import DEFAULT_XID_POLICY
from tests.support.nodes import inventory_for

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC).timestamp()
STARTED = T0 - 100
INVENTORY = inventory_for("mixed", "vgpu-partitions")
GPUS = sorted({gpu.uuid for gpu in INVENTORY.gpu_of_device.values()})
GPU = GPUS[0]
OF_GPU = [name for name, gpu in INVENTORY.gpu_of_device.items() if gpu.uuid == GPU]
SHARED, UNUSED = OF_GPU[0], OF_GPU[1]


def down(at: float = T0) -> GpuDaemons:
    return GpuDaemons().reported(GPU, False, "daemon-a", at).with_share_devices({GPU: frozenset({SHARED})})


def test_a_daemon_answering_or_stopped_with_its_last_share_says_nothing() -> None:
    for up in (True, None):
        assert GpuDaemons().reported(GPU, up, "daemon-a", T0) == GpuDaemons()


def test_a_dead_daemon_is_down_since_its_first_report_and_up_again_as_of_its_return() -> None:
    first = GpuDaemons().reported(GPU, False, "daemon-a", T0)
    assert first.states == {GPU: DaemonState(down=True, since=T0, name="daemon-a")}
    assert first.reported(GPU, False, "daemon-a", T0 + 10) is first, "each probe reports it again"
    back = first.reported(GPU, True, "daemon-a", T0 + 20)
    assert back.states == {GPU: DaemonState(down=False, since=T0 + 20, name="daemon-a")}
    assert first.reported(GPU, None, "daemon-a", T0 + 20) == back, "its last share gone: nothing is unhealthy"


def test_share_devices_are_kept_only_for_gpus_with_a_daemon_state() -> None:
    devices = {GPU: frozenset({SHARED}), GPUS[1]: frozenset({"other"}), GPUS[2]: frozenset()}
    daemons = GpuDaemons().reported(GPU, False, "daemon-a", T0).with_share_devices(devices)
    assert daemons.share_devices == {GPU: frozenset({SHARED})}
    assert daemons.with_share_devices(devices) is daemons


def test_only_the_devices_of_the_gpus_prepared_shares_are_unhealthy_while_its_daemon_is_down() -> None:
    health = node_health(HealthState(started_at=STARTED), INVENTORY, "node-a", down())

    expected = DeviceHealth(HealthStatus.UNHEALTHY, T0, down_message(GPU, down().states[GPU]))
    assert health.devices[SHARED] == expected
    healthy = DeviceHealth(HealthStatus.HEALTHY, STARTED, "")
    assert all(device == healthy for name, device in health.devices.items() if name != SHARED), (
        "the GPU's unused vGPU devices and every device of the other GPUs are unaffected"
    )
    assert UNUSED in health.devices


def test_the_message_names_the_daemon_the_gpu_and_what_to_do() -> None:
    message = down_message(GPU, DaemonState(down=True, since=T0, name="daemon-a"))
    assert message == (
        f"the MPS control daemon daemon-a of GPU {GPU} (vgpu.enforcement: mps) has not answered since "
        "2026-11-27T10:00:00Z: pods of vGPU shares prepared on this GPU lost their MPS server; restart "
        "them (the next prepare of a share on this GPU restarts the daemon)"
    )


def test_a_daemon_answering_again_leaves_its_devices_healthy_as_of_then() -> None:
    back = down().reported(GPU, True, "daemon-a", T0 + 30)
    health = node_health(HealthState(started_at=STARTED), INVENTORY, "node-a", back)

    assert health.devices[SHARED] == DeviceHealth(HealthStatus.HEALTHY, T0 + 30, "")
    assert health.devices[UNUSED] == DeviceHealth(HealthStatus.HEALTHY, STARTED, "")


def test_a_gpu_fault_and_a_dead_daemon_both_show_and_neither_hides_the_other() -> None:
    state = apply(HealthState(started_at=STARTED), XidEvent(GPU, 48, T0 - 50), DEFAULT_XID_POLICY)
    health = node_health(state, INVENTORY, "node-a", down())

    shared = health.devices[SHARED]
    assert shared.status is HealthStatus.UNHEALTHY
    assert shared.since == T0 - 50, "unhealthy since the earlier of the two"
    assert shared.message.startswith("the MPS control daemon daemon-a of GPU")
    assert shared.message.endswith("XID 48 (double-bit ECC error) at 2026-11-27T09:59:10Z; fatal")
    assert len(shared.message) <= MESSAGE_LIMIT
    assert health.devices[UNUSED].message.startswith("XID 48")

    back = node_health(state, INVENTORY, "node-a", down().reported(GPU, True, "daemon-a", T0 + 30))
    assert back.devices[SHARED] == health.devices[UNUSED], "the daemon's return leaves the GPU's own fault"
