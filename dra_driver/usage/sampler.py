"""The usage sampler: every N seconds, on a thread of its own, reads NVML, kubelet's PodResources
and the processes' cgroups, joins them (`attribution`) and hands the result to the metrics.

Its own thread, not the event loop and not the NVML thread prepare uses: every read here may
block (a GPU in trouble can hold an NVML call for seconds, kubelet may be slow), and none of that
may delay a prepare. A source that fails is counted and left out of that sample; the others
still report.
"""

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import msgspec
import structlog

from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.model import Gpu, HardwareError
from dra_driver.hardware.usage import DeviceUsage, UsageReader
from dra_driver.observability.usage_metrics import UsageMetrics
from dra_driver.usage.attribution import NO_POD, DeviceFacts, DeviceUser, UsageReport, attribute, gpu_rows
from dra_driver.usage.cgroups import pods_by_uid, read_pod_cgroups
from dra_driver.usage.pod_resources import PodResourcesClient, PodResourcesUnavailable

log = structlog.get_logger("dra_driver.usage")


class UsageSources(msgspec.Struct, frozen=True):
    """Where a sample reads from; the callables return the agent's state as of now."""

    reader: UsageReader
    driver_name: str
    claims: Callable[[], Iterable[ClaimRecord]]
    facts: Callable[[], Mapping[str, DeviceFacts]]
    gpus: Callable[[], Iterable[Gpu]]
    pod_resources: PodResourcesClient | None = None
    # Where processes' cgroups are read (None: processes are not attributed by cgroup).
    proc_root: Path | None = None
    pod_logs_dir: Path = Path("/var/log/pods")


def _claims(sources: UsageSources) -> tuple[ClaimRecord, ...]:
    """The engine's dict changes under prepare on the event loop; copying it is one C-level pass,
    retried in the rare case the dict was resized during it."""
    for _attempt in range(3):
        try:
            return tuple(sources.claims())
        except RuntimeError:
            continue
    return ()


def _process_pods(
    sources: UsageSources, usage: tuple[DeviceUsage, ...], metrics: UsageMetrics
) -> dict[int, tuple[str, str]]:
    if sources.proc_root is None:
        return {}
    pids = {process.pid for device in usage for process in device.processes}
    if not pids:
        return {}
    cgroups = read_pod_cgroups(sources.proc_root, pids)
    if not cgroups:
        metrics.sample_errors.labels(source="cgroups").inc()
        return {}
    names = pods_by_uid(sources.pod_logs_dir)
    # A process outside any pod, or in a pod whose name is unknown, is known not to be a claim's.
    return {pid: names.get(pod.pod_uid, NO_POD) if pod else NO_POD for pid, pod in cgroups.items()}


class _Failing:
    """Sources failing now: each failure is counted every sample, but logged when it starts and
    when it ends, not every few seconds for as long as it lasts."""

    def __init__(self) -> None:
        self._sources: set[str] = set()

    def failed(self, source: str, event: str, error: Exception, metrics: UsageMetrics) -> None:
        metrics.sample_errors.labels(source=source).inc()
        if source not in self._sources:
            self._sources.add(source)
            log.warning(event, error=str(error), until="it recovers (logged once)")

    def succeeded(self, source: str) -> None:
        if source in self._sources:
            self._sources.discard(source)
            log.info("usage sample: source recovered", source=source)


_FAILING = _Failing()


def sample(sources: UsageSources, metrics: UsageMetrics, failing: _Failing = _FAILING) -> UsageReport:
    """One sample, published; blocking (call it off the event loop)."""
    started = time.monotonic()
    try:
        usage = sources.reader.read_usage()
        failing.succeeded("nvml")
    except HardwareError as error:
        failing.failed("nvml", "usage sample: cannot read the GPUs", error, metrics)
        usage = ()
    users: tuple[DeviceUser, ...] | None = None
    if sources.pod_resources is not None:
        try:
            users = sources.pod_resources.list_users(sources.driver_name)
            failing.succeeded("podresources")
        except PodResourcesUnavailable as error:
            failing.failed("podresources", "usage sample: no pods from kubelet", error, metrics)
    index_of = {gpu.uuid: (gpu.index, gpu.product_name) for gpu in sources.gpus()}
    report = UsageReport(
        gpus=gpu_rows(usage, index_of),
        claims=attribute(
            _claims(sources), sources.facts(), usage, users, _process_pods(sources, usage, metrics)
        ),
    )
    metrics.publish(report.gpus, report.claims)
    metrics.sample_duration.set(time.monotonic() - started)
    metrics.last_sample.set(time.time())
    return report


class UsageSampler:
    """Samples every `interval` seconds on a daemon thread until stopped. A sample stuck in the
    driver keeps its thread; stop() does not wait for it past `stop_timeout`, and the process can
    still exit (daemon thread)."""

    def __init__(self, sources: UsageSources, metrics: UsageMetrics, interval: float) -> None:
        self._sources = sources
        self._metrics = metrics
        self._interval = interval
        self._stopping = threading.Event()
        self._failing = _Failing()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                sample(self._sources, self._metrics, self._failing)
            except Exception:
                log.exception("usage sample failed")
            self._stopping.wait(self._interval)

    def stop(self, stop_timeout: float = 2.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(stop_timeout)
        if not self._thread.is_alive():
            self._sources.reader.close()
            if self._sources.pod_resources is not None:
                self._sources.pod_resources.close()
