"""The node agent's Prometheus metrics, on a registry of its own.

A registry of our own (not the client's global one) keeps in-process tests independent: each
controller or engine under test can be given a fresh one. The parts of the agent each take the
group of metrics they update (`PublishMetrics`, `ClaimMetrics`); `AgentMetrics` puts every group
on one registry, the one the /metrics endpoint serves.

The metrics depend on nothing but their own vocabulary (`error_reasons`): callers hand them label
values, errors that name their reason, and shapes described here, so that every layer may record
metrics without the metrics tying the layers together (the import contract in pyproject.toml).
"""

import contextlib
import platform
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from dra_driver import __version__
from dra_driver.observability.error_reasons import ERROR_REASONS, ErrorReason


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


class UsageGpu(Protocol):
    """The GPU a usage row is about: the labels both kinds of row open with (GPU_LABELS)."""

    @property
    def gpu(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def model(self) -> str: ...


class GpuUsageRow(UsageGpu, Protocol):
    """One GPU's usage (`usage.attribution.GpuRow`); utilization None: the hardware has no figure."""

    @property
    def memory_used_bytes(self) -> int: ...
    @property
    def memory_total_bytes(self) -> int: ...
    @property
    def utilization(self) -> float | None: ...
    @property
    def processes(self) -> int: ...


class ClaimUsageRow(UsageGpu, Protocol):
    """One claim's device as one pod's container uses it (`usage.attribution.ClaimRow`)."""

    @property
    def device(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def claim(self) -> str: ...
    @property
    def memory_limit_bytes(self) -> int: ...
    @property
    def compute_limit(self) -> float: ...
    @property
    def memory_used_bytes(self) -> int | None: ...
    @property
    def utilization(self) -> float | None: ...


# dcgm-exporter's label names where they overlap (gpu, UUID, modelName, namespace, pod, container),
# so dashboards can join the two; `device` and `claim` are DRA's own.
GPU_LABELS = ("gpu", "UUID", "modelName")
CLAIM_LABELS = (*GPU_LABELS, "device", "namespace", "pod", "container", "claim")


def _gpu_values(row: UsageGpu) -> list[str]:
    return [row.gpu, row.uuid, row.model]


class UsageMetrics:
    """GPU usage by device and by claim, pod and container, as of the last sample.

    A collector rather than labelled gauges: each sample replaces the whole set in one assignment,
    so a scrape never sees half of one sample, and a claim or pod that is gone has no series left
    (the set of series is bounded by what is prepared now, not by what ever was).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._gpus: tuple[GpuUsageRow, ...] = ()
        self._claims: tuple[ClaimUsageRow, ...] = ()
        self.sample_errors = Counter(
            "dra_driver_usage_sample_errors",
            "Usage samples that could not read a source (nvml, podresources, cgroups)",
            ["source"],
            registry=registry,
        )
        for source in ("nvml", "podresources", "cgroups"):
            self.sample_errors.labels(source=source)
        self.sample_duration = Gauge(
            "dra_driver_usage_sample_duration_seconds",
            "How long the last usage sample took (NVML, kubelet and /proc reads together)",
            registry=registry,
        )
        self.last_sample = Gauge(
            "dra_driver_usage_last_sample_timestamp_seconds",
            "Unix time of the last completed usage sample",
            registry=registry,
        )
        registry.register(self)

    def publish(self, gpus: Iterable[GpuUsageRow], claims: Iterable[ClaimUsageRow]) -> None:
        gpu_rows, claim_rows = tuple(gpus), tuple(claims)
        with self._lock:
            self._gpus, self._claims = gpu_rows, claim_rows

    def describe(self) -> Iterator[Metric]:
        return self._families((), ())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            gpus, claims = self._gpus, self._claims
        return self._families(gpus, claims)

    @staticmethod
    def _families(gpus: tuple[GpuUsageRow, ...], claims: tuple[ClaimUsageRow, ...]) -> Iterator[Metric]:
        def family(name: str, text: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=list(labels))

        memory_used = family("dra_driver_gpu_memory_used_bytes", "GPU memory in use", GPU_LABELS)
        memory_total = family("dra_driver_gpu_memory_total_bytes", "GPU memory in all", GPU_LABELS)
        utilization = family(
            "dra_driver_gpu_utilization_ratio",
            "Fraction of the last sample period a kernel ran on the GPU (NVML utilization.gpu / 100)",
            GPU_LABELS,
        )
        processes = family("dra_driver_gpu_processes", "Compute processes running on the GPU", GPU_LABELS)
        for gpu in gpus:
            values = _gpu_values(gpu)
            memory_used.add_metric(values, gpu.memory_used_bytes)
            memory_total.add_metric(values, gpu.memory_total_bytes)
            processes.add_metric(values, gpu.processes)
            if gpu.utilization is not None:
                utilization.add_metric(values, gpu.utilization)
        claim_used = family(
            "dra_driver_claim_memory_used_bytes",
            "GPU memory the claim's processes on the device use (absent where they cannot be told apart)",
            CLAIM_LABELS,
        )
        claim_limit = family(
            "dra_driver_claim_memory_limit_bytes",
            "GPU memory the claim may use on the device: the vGPU share, the MIG size or the whole GPU",
            CLAIM_LABELS,
        )
        claim_utilization = family(
            "dra_driver_claim_utilization_ratio",
            "SM utilisation of the claim's processes (per-process NVML samples), or of the device "
            "when the claim is its only user",
            CLAIM_LABELS,
        )
        claim_compute = family(
            "dra_driver_claim_compute_limit_ratio",
            "Fraction of the GPU's compute the claim may use: the vGPU share's cores, the MIG "
            "instance's share of SMs, 1 for a whole GPU",
            CLAIM_LABELS,
        )
        for row in claims:
            values = [
                *_gpu_values(row),
                row.device,
                row.namespace,
                row.pod,
                row.container,
                row.claim,
            ]
            claim_limit.add_metric(values, row.memory_limit_bytes)
            claim_compute.add_metric(values, row.compute_limit)
            if row.memory_used_bytes is not None:
                claim_used.add_metric(values, row.memory_used_bytes)
            if row.utilization is not None:
                claim_utilization.add_metric(values, row.utilization)
        yield from (memory_used, memory_total, utilization, processes)
        yield from (claim_used, claim_limit, claim_utilization, claim_compute)


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
