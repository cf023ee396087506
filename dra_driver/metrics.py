"""The node agent's Prometheus metrics, on a registry of its own.

A registry of our own (not the client's global one) keeps in-process tests independent: each
controller or engine under test can be given a fresh one. The parts of the agent each take the
group of metrics they update (`PublishMetrics`, `ClaimMetrics`); `AgentMetrics` puts every group
on one registry, the one the /metrics endpoint serves.
"""

import platform
from collections import Counter as Tally
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dra_driver import __version__
from dra_driver.claims.allocation import ClaimRejected
from dra_driver.claims.cdi import InvalidCdiName
from dra_driver.claims.identity import InvalidClaimIdentity
from dra_driver.claims.opaque_config import OpaqueConfigError
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import DeviceType
from dra_driver.devices.node_config import ConfigProblem
from dra_driver.hardware.model import HardwareError
from dra_driver.health.model import HealthStatus, NodeHealth


@dataclass
class PublishMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    slice_writes: Counter = field(init=False)
    slice_api_errors: Counter = field(init=False)
    api_features_missing: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.slice_writes = Counter(
            "dra_driver_resourceslice_writes",
            "ResourceSlice writes that the API server accepted, by verb",
            ["verb"],
            registry=self.registry,
        )
        self.slice_api_errors = Counter(
            "dra_driver_resourceslice_api_errors",
            "Failed ResourceSlice API calls, by verb and HTTP status (0 = no answer)",
            ["verb", "status"],
            registry=self.registry,
        )
        self.api_features_missing = Gauge(
            "dra_driver_api_feature_missing",
            "1 when the API server drops the fields of this DRA feature, so the driver falls back",
            ["feature"],
            registry=self.registry,
        )


# From an already prepared claim answered from memory (well under a millisecond) to a MIG
# instance created on a busy GPU (tens of seconds; kubelet's own deadline is 45 s).
CLAIM_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 45)

# Why a claim failed, as a closed set: the error messages themselves name claims and devices,
# so as labels they would make a new series per claim.
ErrorReason = Literal["invalid_identity", "claim_rejected", "config", "hardware", "internal"]
ERROR_REASONS: tuple[ErrorReason, ...] = get_args(ErrorReason)


def _caused_by_hardware(error: BaseException) -> bool:
    """The engine wraps hardware failures in ClaimRejected (`raise ... from`), so the explicit
    cause chain is followed; implicit context (an error while handling another) is not a cause."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, HardwareError):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def error_reason(error: BaseException) -> ErrorReason:
    """The metric label for a claim's failure, from the exception the engine caught.

    A CDI name counts as identity: it is built from the claim's UID and device names, and breaks
    the naming rules only when those do. A configuration error is a ClaimRejected too, so it is
    told apart first; a rejection caused by the hardware counts as hardware, as it points at the
    node rather than at the claim.
    """
    if isinstance(error, InvalidClaimIdentity | InvalidCdiName):
        return "invalid_identity"
    if isinstance(error, OpaqueConfigError):
        return "config"
    if _caused_by_hardware(error):
        return "hardware"
    if isinstance(error, ClaimRejected):
        return "claim_rejected"
    return "internal"


@dataclass
class ClaimMetrics:
    """What the claim engine records: one observation per claim, not per kubelet call, since
    the claims of one call are prepared concurrently and fail independently."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    prepare_duration: Histogram = field(init=False)
    unprepare_duration: Histogram = field(init=False)
    prepare_errors: Counter = field(init=False)
    unprepare_errors: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.prepare_duration = Histogram(
            "dra_driver_prepare_duration_seconds",
            "Time to prepare one claim, failures included",
            registry=self.registry,
            buckets=CLAIM_DURATION_BUCKETS,
        )
        self.unprepare_duration = Histogram(
            "dra_driver_unprepare_duration_seconds",
            "Time to unprepare one claim, failures included",
            registry=self.registry,
            buckets=CLAIM_DURATION_BUCKETS,
        )
        self.prepare_errors = Counter(
            "dra_driver_prepare_errors",
            "Claims whose prepare failed, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.unprepare_errors = Counter(
            "dra_driver_unprepare_errors",
            "Claims whose unprepare failed, by reason",
            ["reason"],
            registry=self.registry,
        )
        # Every reason is exported from the start, so rate() sees the first failure as an increase.
        for reason in ERROR_REASONS:
            self.prepare_errors.labels(reason=reason)
            self.unprepare_errors.labels(reason=reason)

    def prepare_failed(self, error: BaseException) -> None:
        self.prepare_errors.labels(reason=error_reason(error)).inc()

    def unprepare_failed(self, error: BaseException) -> None:
        self.unprepare_errors.labels(reason=error_reason(error)).inc()


DEVICE_TYPES: tuple[DeviceType, ...] = get_args(DeviceType)


def device_counts(
    inventory: Inventory, node_health: NodeHealth
) -> dict[tuple[DeviceType, HealthStatus], int]:
    """Published devices by (type, health), every combination present (zero where none).

    A device the health report does not name counts as unknown, as kubelet shows it: healthy
    would claim a check that never happened."""
    tally = Tally(
        (
            device.type,
            health.status if (health := node_health.devices.get(device.name)) else HealthStatus.UNKNOWN,
        )
        for device in inventory.devices
    )
    return {(kind, status): tally[kind, status] for kind in DEVICE_TYPES for status in HealthStatus}


@dataclass
class AgentMetrics:
    """Every metric of the node agent, on one registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    publish: PublishMetrics = field(init=False)
    claims: ClaimMetrics = field(init=False)
    devices: Gauge = field(init=False)
    kubelet_registered: Gauge = field(init=False)
    build_info: Gauge = field(init=False)
    node_config_problems: Gauge = field(init=False)
    node_config_info: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.publish = PublishMetrics(self.registry)
        self.claims = ClaimMetrics(self.registry)
        self.devices = Gauge(
            "dra_driver_devices",
            "Devices this node publishes, by type and health (unknown: no health reported for it)",
            ["type", "health"],
            registry=self.registry,
        )
        self.kubelet_registered = Gauge(
            "dra_driver_kubelet_registered",
            "1 while kubelet has accepted the plugin's registration, else 0",
            registry=self.registry,
        )
        self.build_info = Gauge(
            "dra_driver_build_info",
            "Always 1; the labels say which driver version runs on which Python",
            ["version", "python"],
            registry=self.registry,
        )
        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)
        self.node_config_problems = Gauge(
            "dra_driver_node_config_problems",
            "Node config settings that cannot be applied: 1 per GPU (index; empty: the file as a "
            "whole) and setting. A GPU with a problem offers nothing",
            ["gpu", "setting"],
            registry=self.registry,
        )
        self.node_config_info = Gauge(
            "dra_driver_node_config_info",
            "Always 1; the label says which named node config is in force (empty: none named)",
            ["config"],
            registry=self.registry,
        )

    def set_node_config(self, name: str, problems: Iterable[ConfigProblem]) -> None:
        """Call whenever the node config in force or its problems change: series of problems
        that went away are removed, not left at their last value."""
        self.node_config_info.clear()
        self.node_config_info.labels(config=name).set(1)
        self.node_config_problems.clear()
        for problem in problems:
            gpu = "" if problem.gpu is None else str(problem.gpu.index)
            self.node_config_problems.labels(gpu=gpu, setting=problem.setting).set(1)

    def set_devices(self, inventory: Inventory, node_health: NodeHealth) -> None:
        """Call whenever the published inventory or the health report changes."""
        for (kind, status), count in device_counts(inventory, node_health).items():
            self.devices.labels(type=kind, health=status.value).set(count)
