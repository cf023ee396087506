"""The pure parts of the side-by-side benchmark (go_driver.py): the Go drivers' command lines and
objects, the agents' process figures read from /proc, the scheduler's figures, and the summary
with its ratios.
Kept apart from the run so that the unit tests check them without a cluster."""

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from tests.bench.pod_start.pods import MIG_1G, WHOLE_GPU, namespaced_template
from tests.cluster.build import Component, dra_example_driver_component, dra_test_driver_component
from tests.cluster.layout import CGROUP_ROOT, NODE_NAME, Layout

SIZES = (1, 8)
GO_DEVICES = 8
NOTE = (
    "The Go drivers do almost nothing per claim: no hardware; upstream's test driver writes one "
    "CDI spec of environment variables per claim, dra-example-driver one CDI spec per claim and "
    "a checkpoint of its prepared claims. Ours does its full prepare: device ownership taken, "
    "metadata files, a CDI spec and a claim record written, and for the 8-claim pods 8 MIG "
    "1g.10gb devices created on the mock NVML (our node has 5 whole GPUs, so 8 whole-GPU claims "
    "cannot be had). The comparable figure is the 1-claim pod (our whole GPU against one of "
    "their devices); the 8-claim ratios measure MIG creation against writing 8 files."
)


@dataclass(frozen=True, slots=True)
class Side:
    """One driver of the comparison: its key in the report, its name as kubelet's metrics label
    it and the template of each pod size's claims."""

    key: str
    driver: str
    templates: Mapping[int, str]


@dataclass(frozen=True, slots=True)
class GoDriver:
    """A Go kubelet plugin run beside ours as a host process: how it is built and started, the
    directories it needs made for it, and the DeviceClass that selects its devices."""

    side: Side
    source: str
    service: str
    binary: str
    component: Callable[[], Component]
    argv: Callable[[Path, Layout], list[str]]
    premade_dirs: Callable[[Layout], list[Path]]
    device_class: str

    def env(self, layout: Layout, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment with KUBECONFIG naming the admin kubeconfig: both drivers read
        KUBECONFIG (the test driver over its --kubeconfig flag), so a caller's own must not
        leak in."""
        return {**environ, "KUBECONFIG": str(layout.kubeconfig("admin"))}

    def class_object(self) -> dict[str, Any]:
        """Every device of the driver, as both projects' example DeviceClasses select them."""
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": self.device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{self.side.driver}"'}}]},
        }

    def template(self) -> dict[str, Any]:
        return namespaced_template(self.side.templates[1], {"deviceClassName": self.device_class})


OURS = Side("ours", DEFAULT_DRIVER_NAME, {1: WHOLE_GPU, 8: MIG_1G})

# The test driver's default name (app/server.go, --drivername): the one its e2e tests use.
_TEST_DRIVER_NAME = "test-driver.cdi.k8s.io"


def test_driver_argv(binary: Path, layout: Layout) -> list[str]:
    """`dra-test-driver kubelet-plugin` as a host process beside kubelet: the admin kubeconfig
    (it publishes its own ResourceSlices), kubelet's registrar and plugins directories (it makes
    <datadir>/<driver name>/ for its socket itself) and a CDI directory containerd reads."""
    return [
        str(binary),
        "--kubeconfig", str(layout.kubeconfig("admin")),
        "--drivername", _TEST_DRIVER_NAME,
        "kubelet-plugin",
        "--node-name", NODE_NAME,
        "--num-devices", str(GO_DEVICES),
        "--plugin-registration-path", str(layout.registrar_dir),
        "--datadir", str(layout.plugins_dir),
        "--cdi-dir", str(layout.cdi_dir),
    ]  # fmt: skip


def test_driver_socket_dirs(layout: Layout) -> list[Path]:
    """Where the test driver binds its DRA socket: <datadir>/<driver name>. It makes only the
    parent (app/server.go, MkdirAll of the joined path's Dir) and its bind fails with "no such
    file or directory" without this one, so the benchmark makes it."""
    return [layout.plugins_dir / _TEST_DRIVER_NAME]


def example_driver_argv(binary: Path, layout: Layout) -> list[str]:
    """`dra-example-kubeletplugin` with its gpu profile (driver gpu.example.com, devices gpu-0 to
    gpu-7, no partitions) as a host process: kubelet's registrar directory and plugins directory
    (it makes <plugins>/<driver name>/ itself, for its socket and checkpoint), the CDI directory
    containerd reads; its health and metrics servers off, as they are by default."""
    return [
        str(binary),
        "--kubeconfig", str(layout.kubeconfig("admin")),
        "--node-name", NODE_NAME,
        "--device-profile", "gpu",
        "--num-devices", str(GO_DEVICES),
        "--kubelet-registrar-directory-path", str(layout.registrar_dir),
        "--kubelet-plugins-directory-path", str(layout.plugins_dir),
        "--cdi-root", str(layout.cdi_dir),
        "--healthcheck-port", "-1",
        "--metrics-port", "-1",
    ]  # fmt: skip


TEST_DRIVER = GoDriver(
    side=Side("test-driver", _TEST_DRIVER_NAME, dict.fromkeys(SIZES, "test-driver-device")),
    source="k8s.io/kubernetes/test/e2e/dra/test-driver at v1.37.2 (hack/cluster/modules/dra-test-driver)",
    service="dra-test-driver",
    binary="dra-test-driver",
    component=dra_test_driver_component,
    argv=test_driver_argv,
    premade_dirs=test_driver_socket_dirs,
    device_class="dra-test-driver",
)
EXAMPLE_DRIVER = GoDriver(
    # The gpu profile's default name: <profile>.example.com.
    side=Side("example-driver", "gpu.example.com", dict.fromkeys(SIZES, "example-gpu")),
    source="sigs.k8s.io/dra-example-driver v0.4.0 (hack/cluster/modules/dra-example-driver)",
    service="dra-example-driver",
    binary="dra-example-kubeletplugin",
    component=dra_example_driver_component,
    argv=example_driver_argv,
    premade_dirs=lambda layout: [],
    device_class="gpu.example.com",
)
GO_DRIVERS = (TEST_DRIVER, EXAMPLE_DRIVER)


def order(round_index: int, theirs: Sequence[GoDriver] = GO_DRIVERS) -> list[tuple[int, Side]]:
    """The blocks of one round: per size ours, then each Go driver; the order reversed every
    other round, so a slow stretch of the machine falls on every driver."""
    sides = [OURS, *(driver.side for driver in theirs)]
    if round_index % 2:
        sides.reverse()
    return [(claims, side) for claims in SIZES for side in sides]


def agent_pid(proc: Path = Path("/proc")) -> int:
    """Our agent's main process: `dra-driver node` (the chart's DaemonSet container, the image's
    entrypoint and command) in a cgroup under kubelet's root, and not the child of another such
    process. Found by its command line: the container's pid namespace hides it from crictl's
    host view unless asked per container, and /proc is what the RSS and CPU come from anyway."""
    found: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cgroup = (entry / "cgroup").read_text()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        names = [Path(os.fsdecode(part)).name for part in argv]
        if not any(name == "dra-driver" and names[i + 1 : i + 2] == ["node"] for i, name in enumerate(names)):
            continue
        if f"/{CGROUP_ROOT}" not in cgroup:
            continue
        found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    roots = sorted(pid for pid, parent in found.items() if parent not in found)
    if len(roots) != 1:
        raise RuntimeError(f"expected one `dra-driver node` process under {CGROUP_ROOT}, found {roots}")
    return roots[0]


def process_figures(pid: int, proc: Path = Path("/proc")) -> dict[str, float]:
    """Resident memory (VmRSS) and CPU seconds so far (utime + stime, every thread's)."""
    rss_kib = next(
        int(line.split()[1])
        for line in (proc / str(pid) / "status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    # Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return {"rss_mib": round(rss_kib / 1024, 2), "cpu_s": round(ticks / os.sysconf("SC_CLK_TCK"), 2)}


def _percentiles(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 1),
    }


def prepare_means(kubelet_dra: Mapping[str, Mapping[str, float]]) -> list[float]:
    """Kubelet's mean NodePrepareResources gRPC call of one block (dra_grpc_operations series)."""
    return [value["mean_ms"] for key, value in kubelet_dra.items() if "NodePrepareResources" in key]


def scheduler_readings(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """From one scrape of the scheduler, the sums and counts a block diffs (`scheduler_figures`):
    its attempts that placed a pod, and the pod scheduling SLI (from entering the queue to bind,
    every attempt of the pod)."""
    wanted = {
        "attempt_s": ("scheduler_scheduling_attempt_duration_seconds_sum", {"result": "scheduled"}),
        "attempts": ("scheduler_scheduling_attempt_duration_seconds_count", {"result": "scheduled"}),
        "sli_s": ("scheduler_pod_scheduling_sli_duration_seconds_sum", {}),
        "sli_pods": ("scheduler_pod_scheduling_sli_duration_seconds_count", {}),
    }
    return {
        key: sum(
            value
            for (name, labels), value in samples.items()
            if name == metric and all(dict(labels).get(k) == v for k, v in match.items())
        )
        for key, (metric, match) in wanted.items()
    }


_SCHEDULER_KEYS = ("attempt_s", "attempts", "sli_s", "sli_pods")


def scheduler_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 6) for name in after}


def _mean_ms(total_s: float, count: float) -> float | None:
    return round(total_s / count * 1000, 2) if count else None


def summary(blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per driver and size, every round's pods pooled: p50, p90, mean; kubelet's mean prepare
    call; the scheduler's mean placing attempt and SLI; the agent's CPU per recorded pod (its
    whole process: background work included) and its RSS after the last block."""
    pooled: dict[str, dict[str, dict[str, list[float]]]] = {}
    for block in blocks:
        entry = pooled.setdefault(block["driver"], {}).setdefault(
            f"claims_{block['claims']}",
            {"seconds": [], "prepare": [], "cpu": [], "rss": [], **{key: [] for key in _SCHEDULER_KEYS}},
        )
        entry["seconds"].extend(block["pod_start_s"])
        entry["prepare"].extend(prepare_means(block["kubelet_dra"]))
        cpu = block["agent"]["after"]["cpu_s"] - block["agent"]["before"]["cpu_s"]
        entry["cpu"].append(cpu / len(block["pod_start_s"]))
        entry["rss"].append(block["agent"]["after"]["rss_mib"])
        for key in _SCHEDULER_KEYS:
            entry[key].append(block.get("scheduler", {}).get(key, 0.0))
    result: dict[str, Any] = {}
    for driver, sizes in pooled.items():
        for size, entry in sizes.items():
            result.setdefault(driver, {})[size] = {
                "pods": len(entry["seconds"]),
                **_percentiles(entry["seconds"]),
                "kubelet_prepare_call_mean_ms": (
                    round(statistics.fmean(entry["prepare"]), 3) if entry["prepare"] else None
                ),
                "scheduler_attempt_mean_ms": _mean_ms(sum(entry["attempt_s"]), sum(entry["attempts"])),
                "scheduler_sli_mean_ms": _mean_ms(sum(entry["sli_s"]), sum(entry["sli_pods"])),
                "agent_cpu_ms_per_pod": round(statistics.fmean(entry["cpu"]) * 1000, 1),
                "agent_rss_mib_after": entry["rss"][-1],
            }
    return result


def ratios(figures: Mapping[str, Any], theirs_key: str) -> dict[str, dict[str, float | None]]:
    """ours / theirs of every figure both drivers have, per size (None where theirs is 0)."""
    result: dict[str, dict[str, float | None]] = {}
    ours, theirs = figures.get(OURS.key, {}), figures.get(theirs_key, {})
    for size in sorted(set(ours) & set(theirs)):
        result[size] = {}
        for name, value in ours[size].items():
            other = theirs[size].get(name)
            if name == "pods" or value is None or other is None:
                continue
            result[size][name] = round(value / other, 2) if other else None
    return result


def all_ratios(figures: Mapping[str, Any], theirs: Sequence[GoDriver] = GO_DRIVERS) -> dict[str, Any]:
    """Ours over each Go driver, keyed by its report key."""
    return {driver.side.key: ratios(figures, driver.side.key) for driver in theirs}
