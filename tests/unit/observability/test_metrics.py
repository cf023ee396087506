"""The agent's metrics: how claim failures are classified, what the histograms record, and how
devices are counted by type and health."""

import platform

import pytest
from prometheus_client import CollectorRegistry

from dra_driver import __version__
from dra_driver.claims.cdi import ContainerEdits, InvalidCdiName, claim_spec
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import InvalidClaimIdentity, claim_ref
from dra_driver.claims.opaque_config import OpaqueConfigError
from dra_driver.hardware.model import HardwareError, HardwareErrorReason
from dra_driver.health.census import device_counts, device_labels
from dra_driver.health.model import DeviceHealth, HealthStatus, NodeHealth
from dra_driver.observability.error_reasons import ERROR_REASONS, ErrorReason
from dra_driver.observability.metrics import AgentMetrics, ClaimMetrics, PublishMetrics, error_reason
from tests.support.nodes import inventory_for

GPU_LOST = HardwareError("NVML: the GPU is lost", HardwareErrorReason.GPU_LOST)


def raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """`error` as the engine catches it: raised, with `cause` as its explicit cause."""
    try:
        raise error from cause
    except BaseException as caught:
        return caught


def raised_while_handling(error: BaseException, handled: BaseException) -> BaseException:
    """`error` raised inside the handler of `handled`, without `from`: only its context."""
    try:
        try:
            raise handled
        except BaseException:
            raise error  # noqa: B904 - an implicit context is the point
    except BaseException as caught:
        return caught


def identity_error() -> BaseException:
    with pytest.raises(InvalidClaimIdentity) as caught:
        claim_ref("Not_A_Namespace", "claim", "not-a-uid")
    return caught.value


def cdi_name_error() -> BaseException:
    with pytest.raises(InvalidCdiName) as caught:
        claim_spec(
            "gpu.dra-driver.dev", "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6", [("bad name!", ContainerEdits())]
        )
    return caught.value


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        pytest.param(identity_error(), "invalid_identity", id="claim identity"),
        pytest.param(cdi_name_error(), "invalid_identity", id="CDI name"),
        pytest.param(raised(OpaqueConfigError("sharing: unknown strategy")), "config", id="opaque config"),
        pytest.param(raised(ClaimRejected("device taken")), "claim_rejected", id="rejected"),
        pytest.param(
            raised(ClaimRejected("cannot create MIG"), GPU_LOST), "hardware", id="rejected by hardware"
        ),
        pytest.param(raised(HardwareError("destroy failed")), "hardware", id="hardware"),
        pytest.param(
            raised(RuntimeError("wrapped"), raised(ClaimRejected("x"), GPU_LOST)), "hardware", id="deep cause"
        ),
        pytest.param(raised(OpaqueConfigError("bad"), GPU_LOST), "config", id="config before hardware"),
        pytest.param(raised(OSError(28, "No space left on device")), "internal", id="disk full"),
        pytest.param(raised(KeyError("uid")), "internal", id="bug"),
        pytest.param(raised_while_handling(KeyError("uid"), GPU_LOST), "internal", id="context is no cause"),
    ],
)
def test_error_reason_maps_the_engines_exceptions_to_a_closed_set(
    error: BaseException, reason: ErrorReason
) -> None:
    assert error_reason(error) == reason
    assert reason in ERROR_REASONS


def test_error_reason_survives_a_cause_cycle() -> None:
    first = ClaimRejected("first")
    second = RuntimeError("second")
    first.__cause__ = second
    second.__cause__ = first

    assert error_reason(first) == "claim_rejected"
    assert error_reason(second) == "internal"


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    assert value is not None, f"{name}{labels or ''} is not exported"
    return value


def test_histograms_record_each_claim_in_its_bucket() -> None:
    metrics = ClaimMetrics()

    metrics.prepare_duration.observe(0.0007)
    metrics.prepare_duration.observe(30)
    metrics.unprepare_duration.observe(0.02)

    registry = metrics.registry
    prepare = "dra_driver_prepare_duration_seconds"
    assert sample(registry, f"{prepare}_bucket", {"le": "0.0005"}) == 0
    assert sample(registry, f"{prepare}_bucket", {"le": "0.001"}) == 1
    assert sample(registry, f"{prepare}_bucket", {"le": "10.0"}) == 1
    assert sample(registry, f"{prepare}_bucket", {"le": "45.0"}) == 2
    assert sample(registry, f"{prepare}_count") == 2
    assert sample(registry, f"{prepare}_sum") == pytest.approx(30.0007)
    unprepare = "dra_driver_unprepare_duration_seconds"
    assert sample(registry, f"{unprepare}_bucket", {"le": "0.01"}) == 0
    assert sample(registry, f"{unprepare}_bucket", {"le": "0.025"}) == 1
    assert sample(registry, f"{unprepare}_count") == 1


def test_error_counters_start_at_zero_for_every_reason_and_count_by_reason() -> None:
    metrics = ClaimMetrics()
    registry = metrics.registry
    for reason in ERROR_REASONS:
        assert sample(registry, "dra_driver_prepare_errors_total", {"reason": reason}) == 0
        assert sample(registry, "dra_driver_unprepare_errors_total", {"reason": reason}) == 0

    metrics.prepare_failed(raised(ClaimRejected("device taken")))
    metrics.prepare_failed(raised(ClaimRejected("again")))
    metrics.prepare_failed(raised(OpaqueConfigError("bad config")))
    metrics.unprepare_failed(raised(HardwareError("destroy failed")))

    prepare = {r: sample(registry, "dra_driver_prepare_errors_total", {"reason": r}) for r in ERROR_REASONS}
    assert prepare == {
        "invalid_identity": 0,
        "claim_rejected": 2,
        "config": 1,
        "hardware": 0,
        "internal": 0,
    }
    unprepare = {
        r: sample(registry, "dra_driver_unprepare_errors_total", {"reason": r}) for r in ERROR_REASONS
    }
    assert unprepare == {
        "invalid_identity": 0,
        "claim_rejected": 0,
        "config": 0,
        "hardware": 1,
        "internal": 0,
    }


def health(status: HealthStatus) -> DeviceHealth:
    return DeviceHealth(status=status, since=1_700_000_000.0, message="test")


def devices_gauge(metrics: AgentMetrics) -> dict[tuple[str, str], float]:
    return {
        (kind, status.value): sample(
            metrics.registry, "dra_driver_devices", {"type": kind, "health": status.value}
        )
        for kind in ("gpu", "mig", "vgpu")
        for status in HealthStatus
    }


def test_set_devices_counts_a_real_inventory_by_type_and_health() -> None:
    # The "mixed" node by default: 4 whole GPUs and 2 MIG GPUs with 4 static instances each.
    inventory = inventory_for("mixed", "default")
    node_health = NodeHealth(
        pool="node-a",
        devices={
            "gpu-4": health(HealthStatus.UNHEALTHY),
            "gpu-5": health(HealthStatus.HEALTHY),
            "gpu-6": health(HealthStatus.UNKNOWN),
            "gpu-0-mig-1g10gb-2": health(HealthStatus.HEALTHY),
            "gpu-0-mig-3g40gb-4": health(HealthStatus.UNHEALTHY),
            # Reported but not published (any more): not counted.
            "gpu-9": health(HealthStatus.UNHEALTHY),
        },
    )
    metrics = AgentMetrics()

    metrics.set_devices(device_labels(inventory, node_health))

    assert devices_gauge(metrics) == {
        ("gpu", "healthy"): 1,
        ("gpu", "unhealthy"): 1,
        ("gpu", "unknown"): 2,  # gpu-6 as reported, gpu-7 as not reported
        ("mig", "healthy"): 1,
        ("mig", "unhealthy"): 1,
        ("mig", "unknown"): 6,
        ("vgpu", "healthy"): 0,
        ("vgpu", "unhealthy"): 0,
        ("vgpu", "unknown"): 0,
    }


def test_set_devices_zeroes_combinations_that_are_gone() -> None:
    metrics = AgentMetrics()
    metrics.set_devices(
        device_labels(
            inventory_for("mixed", "default"), NodeHealth("node-a", {"gpu-4": health(HealthStatus.UNHEALTHY)})
        )
    )
    assert devices_gauge(metrics)[("gpu", "unhealthy")] == 1

    # The same GPUs offered as vGPU capacity, and gpu-4 recovered.
    capacity = inventory_for("mixed", "vgpu-capacity")
    metrics.set_devices(
        device_labels(capacity, NodeHealth("node-a", {"gpu-4": health(HealthStatus.HEALTHY)}))
    )

    counts = devices_gauge(metrics)
    assert counts[("gpu", "unhealthy")] == 0
    assert counts[("gpu", "unknown")] == 0
    assert counts[("vgpu", "healthy")] == 1
    assert counts[("vgpu", "unknown")] == 3
    assert sum(counts.values()) == len(capacity.devices)


def test_device_counts_of_every_profile_add_up_to_the_inventory() -> None:
    for profile, config in (
        ("dgx-h100-mig", "mig-dynamic"),
        ("l4x8", "vgpu-partitions"),
        ("t4x4", "default"),
    ):
        inventory = inventory_for(profile, config)
        counts = device_counts(inventory, NodeHealth("node-a"))
        assert sum(counts.values()) == len(inventory.devices) > 0, profile
        assert all(status is HealthStatus.UNKNOWN for (_, status), n in counts.items() if n), profile


def test_agent_metrics_share_one_registry_and_keep_the_publish_metrics() -> None:
    metrics = AgentMetrics()
    metrics.publish.slice_writes.labels(verb="create").inc()
    metrics.claims.prepare_failed(raised(ClaimRejected("taken")))
    metrics.kubelet_registered.set(1)

    registry = metrics.registry
    assert metrics.publish.registry is registry and metrics.claims.registry is registry
    assert sample(registry, "dra_driver_resourceslice_writes_total", {"verb": "create"}) == 1
    assert sample(registry, "dra_driver_prepare_errors_total", {"reason": "claim_rejected"}) == 1
    assert sample(registry, "dra_driver_kubelet_registered") == 1
    build = {"version": __version__, "python": platform.python_version()}
    assert sample(registry, "dra_driver_build_info", build) == 1
    # Each agent (and each test) has a registry of its own: a second one neither clashes nor shares.
    other = AgentMetrics()
    assert sample(other.registry, "dra_driver_prepare_errors_total", {"reason": "claim_rejected"}) == 0


def test_publish_metrics_still_stand_alone() -> None:
    metrics = PublishMetrics()
    metrics.slice_api_errors.labels(verb="update", status="409").inc()

    assert (
        sample(
            metrics.registry, "dra_driver_resourceslice_api_errors_total", {"verb": "update", "status": "409"}
        )
        == 1
    )
    assert metrics.registry.get_sample_value("dra_driver_prepare_duration_seconds_count") is None
