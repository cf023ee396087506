"""The side-by-side benchmark's pure parts: a wrong flag or a misread /proc field would not fail
the run, it would measure the wrong thing, so they are pinned here without a cluster."""

import os
from pathlib import Path

import pytest

from tests.bench.pod_start import go_driver_parts as parts
from tests.cluster.build import kubernetes_component
from tests.cluster.layout import Layout
from tests.cluster.versions import kubernetes_version


def _flags(words: list[str]) -> dict[str, str]:
    return dict(zip(words[::2], words[1::2], strict=True))


def test_the_test_driver_runs_beside_kubelet_with_the_clusters_directories() -> None:
    layout = Layout(Path("/tmp/x"))
    argv = parts.TEST_DRIVER.argv(Path("/bin/dra-test-driver"), layout)
    # Shared flags before the subcommand, the plugin's after it.
    command = argv.index("kubelet-plugin")
    assert _flags(argv[1:command]) == {
        "--kubeconfig": "/tmp/x/kubeconfig/admin.kubeconfig",
        "--drivername": "test-driver.cdi.k8s.io",
    }
    assert _flags(argv[command + 1 :]) == {
        "--node-name": "dra-e2e-node",
        "--num-devices": "8",
        "--plugin-registration-path": str(layout.registrar_dir),
        # The plugins directory itself: the driver appends its own name for its socket.
        "--datadir": str(layout.plugins_dir),
        "--cdi-dir": str(layout.cdi_dir),
    }
    # The driver binds <datadir>/<its name>/dra.sock and makes only <datadir>.
    assert parts.TEST_DRIVER.premade_dirs(layout) == [layout.plugins_dir / "test-driver.cdi.k8s.io"]
    environment = parts.TEST_DRIVER.env(layout, {"KUBECONFIG": "/elsewhere", "PATH": "/bin"})
    assert environment == {"KUBECONFIG": "/tmp/x/kubeconfig/admin.kubeconfig", "PATH": "/bin"}


def test_the_example_driver_runs_its_gpu_profile_with_the_clusters_directories() -> None:
    layout = Layout(Path("/tmp/x"))
    argv = parts.EXAMPLE_DRIVER.argv(Path("/bin/dra-example-kubeletplugin"), layout)
    assert argv[0] == "/bin/dra-example-kubeletplugin"
    assert _flags(argv[1:]) == {
        "--kubeconfig": "/tmp/x/kubeconfig/admin.kubeconfig",
        "--node-name": "dra-e2e-node",
        "--device-profile": "gpu",
        "--num-devices": "8",
        "--kubelet-registrar-directory-path": str(layout.registrar_dir),
        # It makes <plugins>/<driver name> for its socket and checkpoint itself.
        "--kubelet-plugins-directory-path": str(layout.plugins_dir),
        "--cdi-root": str(layout.cdi_dir),
        "--healthcheck-port": "-1",
        "--metrics-port": "-1",
    }
    assert parts.EXAMPLE_DRIVER.premade_dirs(layout) == []
    # The gpu profile names its driver <profile>.example.com when --driver-name is not given.
    assert parts.EXAMPLE_DRIVER.side.driver == "gpu.example.com"


@pytest.mark.parametrize("go_driver", parts.GO_DRIVERS, ids=lambda driver: driver.side.key)
def test_each_class_selects_its_driver_and_its_template_uses_the_class(go_driver: parts.GoDriver) -> None:
    device_class = go_driver.class_object()
    selector = device_class["spec"]["selectors"][0]["cel"]["expression"]
    assert selector == f'device.driver == "{go_driver.side.driver}"'
    template = go_driver.template()
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == device_class["metadata"]["name"]
    assert {go_driver.side.templates[size] for size in parts.SIZES} == {template["metadata"]["name"]}


def test_rounds_interleave_the_drivers_and_reverse_their_order() -> None:
    first = [(claims, side.key) for claims, side in parts.order(0)]
    second = [(claims, side.key) for claims, side in parts.order(1)]
    drivers = ["ours", "test-driver", "example-driver"]
    assert first == [(claims, key) for claims in (1, 8) for key in drivers]
    assert second == [(claims, key) for claims in (1, 8) for key in reversed(drivers)]


def test_each_go_driver_has_its_own_build_key_and_leaves_kubernetes_alone() -> None:
    kubernetes = kubernetes_component(kubernetes_version("1.37"))
    test_driver, example_driver = (driver.component() for driver in parts.GO_DRIVERS)
    assert test_driver.binaries == {"k8s.io/kubernetes/test/e2e/dra/test-driver": "dra-test-driver"}
    assert test_driver.version_vars["k8s.io/component-base/version.gitVersion"] == "v1.37.2"
    assert example_driver.binaries == {
        "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin": "dra-example-kubeletplugin"
    }
    assert "require sigs.k8s.io/dra-example-driver v0.4.0" in (example_driver.module / "go.mod").read_text()
    modules = {kubernetes.module, test_driver.module, example_driver.module}
    assert len(modules) == 3
    assert len({kubernetes.key(), test_driver.key(), example_driver.key()}) == 3


def _process(proc: Path, pid: int, argv: list[str], cgroup: str, parent: int) -> None:
    directory = proc / str(pid)
    directory.mkdir()
    (directory / "cmdline").write_bytes(b"\0".join(part.encode() for part in argv) + b"\0")
    (directory / "cgroup").write_text(f"0::{cgroup}\n")
    # A command name with a parenthesis and spaces: the fields are counted after the last ')'.
    fields = ["S", str(parent), *["0"] * 9, "250", "50", *["0"] * 10]
    (directory / "stat").write_text(f"{pid} (py (x) y) {' '.join(fields)}\n")
    (directory / "status").write_text("Name:\tpython3\nVmRSS:\t  51200 kB\n")


def test_our_agent_is_the_one_dra_driver_node_under_kubelets_cgroups(tmp_path: Path) -> None:
    pod = "/dra-e2e/kubepods/pod1/abc"
    _process(tmp_path, 40, ["/usr/bin/python3", "/usr/local/bin/dra-driver", "node"], pod, 1)
    _process(tmp_path, 41, ["/usr/bin/python3", "/usr/local/bin/dra-driver", "node"], pod, 40)
    _process(tmp_path, 50, ["/usr/bin/python3", "/usr/local/bin/dra-driver", "node"], "/user.slice", 1)
    _process(tmp_path, 60, ["/usr/bin/python3", "/usr/local/bin/dra-driver", "plan"], pod, 1)
    (tmp_path / "self").mkdir()
    assert parts.agent_pid(tmp_path) == 40
    _process(tmp_path, 70, ["dra-driver", "node"], pod, 1)
    with pytest.raises(RuntimeError, match=r"\[40, 70\]"):
        parts.agent_pid(tmp_path)


def test_process_figures_read_rss_and_both_cpu_fields(tmp_path: Path) -> None:
    _process(tmp_path, 7, ["x"], "/", 1)
    ticks = os.sysconf("SC_CLK_TCK")
    assert parts.process_figures(7, tmp_path) == {"rss_mib": 50.0, "cpu_s": round(300 / ticks, 2)}


def _block(
    driver: str, claims: int, seconds: list[float], prepare_ms: float, cpu: float, attempt_s: float
) -> dict[str, object]:
    return {
        "driver": driver,
        "claims": claims,
        "pod_start_s": seconds,
        "kubelet_dra": {
            'dra_grpc_operations_duration_seconds{method_name="/x.DRAPlugin/NodePrepareResources"}': {
                "calls": len(seconds),
                "mean_ms": prepare_ms,
            },
            'dra_operations_duration_seconds{operation_name="PrepareResources"}': {
                "calls": 1,
                "mean_ms": 99.0,
            },
        },
        # One pod of the block needed a second attempt, and the SLI counts it once.
        "scheduler": {
            "attempt_s": attempt_s,
            "attempts": len(seconds) + 1,
            "sli_s": 2 * attempt_s,
            "sli_pods": len(seconds),
        },
        "agent": {
            "before": {"cpu_s": 10.0, "rss_mib": 50.0},
            "after": {"cpu_s": 10.0 + cpu, "rss_mib": 52.0},
        },
    }


def test_summary_pools_rounds_and_ratios_are_ours_over_each_go_driver() -> None:
    blocks = [
        _block("ours", 1, [1.0, 1.2], 4.0, 0.2, 0.03),
        _block("test-driver", 1, [0.5, 0.5], 1.0, 0.02, 0.006),
        _block("ours", 1, [1.4, 1.6], 6.0, 0.4, 0.06),
        _block("test-driver", 1, [0.7, 0.7], 3.0, 0.02, 0.012),
        _block("example-driver", 1, [0.6, 0.6], 2.0, 0.04, 0.009),
    ]
    figures = parts.summary(blocks)
    assert figures["ours"]["claims_1"] == {
        "pods": 4,
        "p50_ms": 1300.0,
        "p90_ms": 1400.0,
        "mean_ms": 1300.0,
        "kubelet_prepare_call_mean_ms": 5.0,
        # Pooled over the blocks' attempts (6) and pods (4), not a mean of the blocks' means.
        "scheduler_attempt_mean_ms": 15.0,
        "scheduler_sli_mean_ms": 45.0,
        "agent_cpu_ms_per_pod": 150.0,
        "agent_rss_mib_after": 52.0,
    }
    ratios = parts.all_ratios(figures)
    assert set(ratios) == {"test-driver", "example-driver"}
    over_test = ratios["test-driver"]["claims_1"]
    assert over_test["p50_ms"] == round(1300 / 600, 2)
    assert over_test["kubelet_prepare_call_mean_ms"] == 2.5
    assert over_test["scheduler_attempt_mean_ms"] == 5.0
    assert over_test["agent_cpu_ms_per_pod"] == 15.0
    assert "pods" not in over_test
    assert ratios["example-driver"]["claims_1"]["p50_ms"] == round(1300 / 600, 2)
    assert ratios["example-driver"]["claims_1"]["kubelet_prepare_call_mean_ms"] == 2.5
    assert parts.ratios({"ours": figures["ours"]}, "test-driver") == {}


def test_scheduler_readings_take_placing_attempts_and_every_sli_observation() -> None:
    attempt = "scheduler_scheduling_attempt_duration_seconds"
    sli = "scheduler_pod_scheduling_sli_duration_seconds"
    samples = {
        (f"{attempt}_sum", (("profile", "default-scheduler"), ("result", "scheduled"))): 0.5,
        (f"{attempt}_count", (("profile", "default-scheduler"), ("result", "scheduled"))): 10.0,
        (f"{attempt}_sum", (("profile", "default-scheduler"), ("result", "unschedulable"))): 9.0,
        (f"{attempt}_count", (("profile", "default-scheduler"), ("result", "unschedulable"))): 3.0,
        (f"{sli}_sum", (("attempts", "1"),)): 0.4,
        (f"{sli}_sum", (("attempts", "2"),)): 0.3,
        (f"{sli}_count", (("attempts", "1"),)): 8.0,
        (f"{sli}_count", (("attempts", "2"),)): 1.0,
        (f"{sli}_bucket", (("attempts", "1"), ("le", "0.1"))): 8.0,
    }
    readings = parts.scheduler_readings(samples)
    assert readings == {"attempt_s": 0.5, "attempts": 10.0, "sli_s": 0.7, "sli_pods": 9.0}
    later = {**readings, "attempt_s": 0.8, "attempts": 14.0}
    assert parts.scheduler_figures(readings, later) == {
        "attempt_s": 0.3,
        "attempts": 4.0,
        "sli_s": 0.0,
        "sli_pods": 0.0,
    }
