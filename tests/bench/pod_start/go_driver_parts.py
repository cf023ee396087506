"""The pure parts of the side-by-side benchmark (go_driver.py): the test driver's command line
and objects, the two agents' process figures read from /proc, and the summary with its ratios.
Kept apart from the run so that the unit tests check them without a cluster."""

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from tests.bench.pod_start.pods import MIG_1G, WHOLE_GPU, namespaced_template
from tests.cluster.layout import CGROUP_ROOT, NODE_NAME, Layout

# The test driver's default name (app/server.go, --drivername): the one its e2e tests use.
TEST_DRIVER_NAME = "test-driver.cdi.k8s.io"
TEST_DEVICE_CLASS = "dra-test-driver"
TEST_TEMPLATE = "test-driver-device"
TEST_DEVICES = 8
SERVICE = "dra-test-driver"
TEST_DRIVER_SOURCE = (
    "k8s.io/kubernetes/test/e2e/dra/test-driver at v1.37.2 (hack/cluster/modules/dra-test-driver)"
)
SIZES = (1, 8)
NOTE = (
    "The test driver does almost nothing per claim: no hardware, one CDI spec of environment "
    "variables written per claim. Ours does its full prepare: device ownership taken, metadata "
    "files, a CDI spec and a claim record written, and for the 8-claim pods 8 MIG 1g.10gb devices "
    "created on the mock "
    "NVML (our node has 5 whole GPUs, so 8 whole-GPU claims cannot be had). The comparable figure "
    "is the 1-claim pod (our whole GPU against one test device); the 8-claim ratios measure MIG "
    "creation against writing 8 files."
)


@dataclass(frozen=True, slots=True)
class Side:
    """One driver of the comparison: its name as kubelet's metrics label it and the template
    of each pod size's claims."""

    key: str
    driver: str
    templates: Mapping[int, str]


OURS = Side("ours", DEFAULT_DRIVER_NAME, {1: WHOLE_GPU, 8: MIG_1G})
THEIRS = Side("theirs", TEST_DRIVER_NAME, {1: TEST_TEMPLATE, 8: TEST_TEMPLATE})


def test_driver_argv(binary: Path, layout: Layout) -> list[str]:
    """`dra-test-driver kubelet-plugin` as a host process beside kubelet: the admin kubeconfig
    (it publishes its own ResourceSlices), kubelet's registrar and plugins directories (it makes
    <datadir>/<driver name>/ for its socket itself) and a CDI directory containerd reads."""
    return [
        str(binary),
        "--kubeconfig", str(layout.kubeconfig("admin")),
        "--drivername", TEST_DRIVER_NAME,
        "kubelet-plugin",
        "--node-name", NODE_NAME,
        "--num-devices", str(TEST_DEVICES),
        "--plugin-registration-path", str(layout.registrar_dir),
        "--datadir", str(layout.plugins_dir),
        "--cdi-dir", str(layout.cdi_dir),
    ]  # fmt: skip


def test_driver_socket_dir(layout: Layout) -> Path:
    """Where the test driver binds its DRA socket: <datadir>/<driver name>. It makes only the
    parent (app/server.go, MkdirAll of the joined path's Dir) and its bind fails with "no such
    file or directory" without this one, so the benchmark makes it."""
    return layout.plugins_dir / TEST_DRIVER_NAME


def test_driver_env(layout: Layout, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with KUBECONFIG naming the admin kubeconfig: the test driver takes
    KUBECONFIG over its --kubeconfig flag, so a caller's own must not leak in."""
    return {**environ, "KUBECONFIG": str(layout.kubeconfig("admin"))}


def test_device_class() -> dict[str, Any]:
    """Every device of the test driver, as its deploy/example/deviceclass.yaml selects them."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": TEST_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{TEST_DRIVER_NAME}"'}}]},
    }


def test_template() -> dict[str, Any]:
    return namespaced_template(TEST_TEMPLATE, {"deviceClassName": TEST_DEVICE_CLASS})


def order(round_index: int) -> list[tuple[int, Side]]:
    """The blocks of one round, ABAB: per size ours then theirs, the pair reversed every other
    round, so a slow stretch of the machine falls on both drivers."""
    pair = [OURS, THEIRS] if round_index % 2 == 0 else [THEIRS, OURS]
    return [(claims, side) for claims in SIZES for side in pair]


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


def summary(blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per driver and size, every round's pods pooled: p50, p90, mean; kubelet's mean prepare
    call; the agent's CPU per recorded pod (its whole process: background work included) and its
    RSS after the last block."""
    pooled: dict[str, dict[str, dict[str, list[float]]]] = {}
    for block in blocks:
        entry = pooled.setdefault(block["driver"], {}).setdefault(
            f"claims_{block['claims']}", {"seconds": [], "prepare": [], "cpu": [], "rss": []}
        )
        entry["seconds"].extend(block["pod_start_s"])
        entry["prepare"].extend(prepare_means(block["kubelet_dra"]))
        cpu = block["agent"]["after"]["cpu_s"] - block["agent"]["before"]["cpu_s"]
        entry["cpu"].append(cpu / len(block["pod_start_s"]))
        entry["rss"].append(block["agent"]["after"]["rss_mib"])
    result: dict[str, Any] = {}
    for driver, sizes in pooled.items():
        for size, entry in sizes.items():
            result.setdefault(driver, {})[size] = {
                "pods": len(entry["seconds"]),
                **_percentiles(entry["seconds"]),
                "kubelet_prepare_call_mean_ms": (
                    round(statistics.fmean(entry["prepare"]), 3) if entry["prepare"] else None
                ),
                "agent_cpu_ms_per_pod": round(statistics.fmean(entry["cpu"]) * 1000, 1),
                "agent_rss_mib_after": entry["rss"][-1],
            }
    return result


def ratios(figures: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """ours / theirs of every figure both drivers have, per size (None where theirs is 0)."""
    result: dict[str, dict[str, float | None]] = {}
    ours, theirs = figures.get(OURS.key, {}), figures.get(THEIRS.key, {})
    for size in sorted(set(ours) & set(theirs)):
        result[size] = {}
        for name, value in ours[size].items():
            other = theirs[size].get(name)
            if name == "pods" or value is None or other is None:
                continue
            result[size][name] = round(value / other, 2) if other else None
    return result
