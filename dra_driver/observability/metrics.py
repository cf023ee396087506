"""The node agent's Prometheus metrics, on a registry of its own.

A registry of our own (not the client's global one) keeps in-process tests independent: each
controller or engine under test can be given a fresh one. The parts of the agent each take the
group of metrics they update (`PublishMetrics`, `ClaimMetrics`, the usage sampler's collector in
`usage_metrics`); `AgentMetrics` puts every group on one registry, the one the /metrics endpoint
serves.

The metrics depend on nothing but their own vocabulary (`error_reasons`): callers hand them label
values, errors that name their reason, and shapes described here, so that every layer may record
metrics without the metrics tying the layers together (the import contract in pyproject.toml).
"""

import contextlib
import platform
from collections.abc import Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dra_driver import __version__
from dra_driver.observability.error_reasons import ERROR_REASONS, ErrorReason
from dra_driver.observability.usage_metrics import UsageMetrics


class PublishMetrics:
    registry: CollectorRegistry
    slice_writes: Counter
    slice_api_errors: Counter
    api_features_missing: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
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

_REASONS: Mapping[str, ErrorReason] = {reason: reason for reason in ERROR_REASONS}
# Faults of what the claim itself says: reported as such even when the hardware failed too.
_CLAIM_FAULTS: frozenset[ErrorReason] = frozenset({"invalid_identity", "config"})


def _named_reason(error: BaseException) -> ErrorReason | None:
    """The reason the error's type names in its `metric_reason` (inherited, so a subclass counts
    as its base does); None for an error that names none."""
    reason = getattr(error, "metric_reason", None)
    return _REASONS.get(reason) if isinstance(reason, str) else None


def _caused_by_hardware(error: BaseException) -> bool:
    """The engine wraps hardware failures in ClaimRejected (`raise ... from`), so the explicit
    cause chain is followed; implicit context (an error while handling another) is not a cause."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if _named_reason(current) == "hardware":
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def error_reason(error: BaseException) -> ErrorReason:
    """The metric label for a claim's failure, from the exception the engine caught.

    A configuration error is a ClaimRejected too, and names its own reason; a rejection caused by
    the hardware counts as hardware, as it points at the node rather than at the claim.
    """
    named = _named_reason(error)
    if named in _CLAIM_FAULTS:
        return named
    if _caused_by_hardware(error):
        return "hardware"
    return named or "internal"


class ClaimMetrics:
    """What the claim engine records: one observation per claim, not per kubelet call, since
    the claims of one call are prepared concurrently and fail independently."""

    registry: CollectorRegistry
    prepare_duration: Histogram
    claim_get_duration: Histogram
    unprepare_duration: Histogram
    prepare_errors: Counter
    unprepare_errors: Counter
    gpu_mps_daemon_up: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self.gpu_mps_daemon_up = Gauge(
            "dra_driver_gpu_mps_daemon_up",
            "Per GPU with vGPU shares under vgpu.enforcement mps: 1 while its MPS control daemon "
            "answers, 0 when it was found dead or failed to start (the next prepare on the GPU "
            "restarts it); no series for a GPU without such shares",
            ["gpu"],
            registry=self.registry,
        )
        self.prepare_duration = Histogram(
            "dra_driver_prepare_duration_seconds",
            "Time to prepare one claim, failures included",
            registry=self.registry,
            buckets=CLAIM_DURATION_BUCKETS,
        )
        self.claim_get_duration = Histogram(
            "dra_driver_claim_get_duration_seconds",
            "Time from asking the API server for a claim to having its answer as JSON, failures "
            "included: the API server's share of the claim's prepare duration (with, when a "
            "call carries many claims, the wait for the agent's event loop to read the answer)",
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

    def gpu_mps_daemon(self, gpu_uuid: str, up: bool | None) -> None:
        """`up` None: the GPU's daemon was stopped with its last share, so its series goes."""
        if up is None:
            with contextlib.suppress(KeyError):
                self.gpu_mps_daemon_up.remove(gpu_uuid)
        else:
            self.gpu_mps_daemon_up.labels(gpu=gpu_uuid).set(1 if up else 0)


# What became of a claim's status.devices write (see claims/status/status_writer.py): per claim, one of
# written, unchanged (already stored), dropped (claim gone, or unprepared first), rejected (the
# server refused it for good: RBAC, validation); per failed attempt, conflict or failed.
CLAIM_STATUS_RESULTS = ("written", "unchanged", "dropped", "rejected", "conflict", "failed")


class ClaimStatusMetrics:
    """The background writes of ResourceClaim status.devices after prepare."""

    registry: CollectorRegistry
    writes: Counter
    pending: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self.writes = Counter(
            "dra_driver_claim_status_writes",
            "ResourceClaim status.devices writes, by result: per claim written, unchanged, dropped "
            "or rejected; per failed attempt conflict or failed (then retried)",
            ["result"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "dra_driver_claim_status_pending",
            "Claims whose status.devices write is queued or being retried",
            registry=self.registry,
        )
        for result in CLAIM_STATUS_RESULTS:
            self.writes.labels(result=result)


class _Gpu(Protocol):
    @property
    def index(self) -> int: ...


class NodeConfigProblem(Protocol):
    """What the problems gauge reads of a node-config problem (`devices.node_config.ConfigProblem`):
    the setting, and the GPU left out because of it (None: the file as a whole)."""

    @property
    def setting(self) -> str: ...

    @property
    def gpu(self) -> _Gpu | None: ...


class AgentMetrics:
    """Every metric of the node agent, on one registry."""

    registry: CollectorRegistry
    publish: PublishMetrics
    claims: ClaimMetrics
    claim_status: ClaimStatusMetrics
    devices: Gauge
    kubelet_registered: Gauge
    build_info: Gauge
    node_config_problems: Gauge
    node_config_info: Gauge
    usage: UsageMetrics

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self.publish = PublishMetrics(self.registry)
        self.claims = ClaimMetrics(self.registry)
        self.claim_status = ClaimStatusMetrics(self.registry)
        self.usage = UsageMetrics(self.registry)
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

    def set_node_config(self, name: str, problems: Iterable[NodeConfigProblem]) -> None:
        """Call whenever the node config in force or its problems change: series of problems
        that went away are removed, not left at their last value."""
        self.node_config_info.clear()
        self.node_config_info.labels(config=name).set(1)
        self.node_config_problems.clear()
        for problem in problems:
            gpu = "" if problem.gpu is None else str(problem.gpu.index)
            self.node_config_problems.labels(gpu=gpu, setting=problem.setting).set(1)

    def set_devices(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Call whenever the published inventory or the health report changes, with the count of
        every (type, health) pair, zeros included (`health.census.device_labels`): a pair that is
        gone then reads 0 rather than its last value."""
        for (kind, health), count in counts.items():
            self.devices.labels(type=kind, health=health).set(count)
