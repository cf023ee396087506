"""The side-by-side benchmark's pure parts: a wrong flag or a misread /proc field would not fail
the run, it would measure the wrong thing, so they are pinned here without a cluster."""

import os
from pathlib import Path

import pytest

from tests.bench.pod_start import go_driver_parts as parts
from tests.cluster.build import dra_test_driver_component, kubernetes_component
from tests.cluster.layout import Layout
from tests.cluster.versions import kubernetes_version


def test_the_test_driver_runs_beside_kubelet_with_the_clusters_directories() -> None:
    layout = Layout(Path("/tmp/x"))
    argv = parts.test_driver_argv(Path("/bin/dra-test-driver"), layout)
    # Shared flags before the subcommand, the plugin's after it.
    command = argv.index("kubelet-plugin")
    shared, plugin = argv[1:command], argv[command + 1 :]
    assert dict(zip(shared[::2], shared[1::2], strict=True)) == {
        "--kubeconfig": "/tmp/x/kubeconfig/admin.kubeconfig",
        "--drivername": "test-driver.cdi.k8s.io",
    }
    assert dict(zip(plugin[::2], plugin[1::2], strict=True)) == {
        "--node-name": "dra-e2e-node",
        "--num-devices": "8",
        "--plugin-registration-path": str(layout.registrar_dir),
        # The plugins directory itself: the driver appends its own name for its socket.
        "--datadir": str(layout.plugins_dir),
        "--cdi-dir": str(layout.cdi_dir),
    }
    # The driver binds <datadir>/<its name>/dra.sock and makes only <datadir>.
    assert parts.test_driver_socket_dir(layout) == layout.plugins_dir / "test-driver.cdi.k8s.io"
    environment = parts.test_driver_env(layout, {"KUBECONFIG": "/elsewhere", "PATH": "/bin"})
    assert environment == {"KUBECONFIG": "/tmp/x/kubeconfig/admin.kubeconfig", "PATH": "/bin"}


def test_the_class_selects_the_test_driver_and_the_template_uses_the_class() -> None:
    selector = parts.test_device_class()["spec"]["selectors"][0]["cel"]["expression"]
    assert selector == 'device.driver == "test-driver.cdi.k8s.io"'
    request = parts.test_template()["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == parts.test_device_class()["metadata"]["name"]


def test_rounds_interleave_the_drivers_and_swap_their_order() -> None:
    first = [(claims, side.key) for claims, side in parts.order(0)]
    second = [(claims, side.key) for claims, side in parts.order(1)]
    assert first == [(1, "ours"), (1, "theirs"), (8, "ours"), (8, "theirs")]
    assert second == [(1, "theirs"), (1, "ours"), (8, "theirs"), (8, "ours")]


def test_the_test_driver_has_its_own_build_key_and_leaves_kubernetes_alone() -> None:
    component = dra_test_driver_component()
    kubernetes = kubernetes_component(kubernetes_version("1.37"))
    assert component.binaries == {"k8s.io/kubernetes/test/e2e/dra/test-driver": "dra-test-driver"}
    assert component.module != kubernetes.module
    assert component.version_vars["k8s.io/component-base/version.gitVersion"] == "v1.37.2"


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
    driver: str, claims: int, seconds: list[float], prepare_ms: float, cpu: float
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
        "agent": {
            "before": {"cpu_s": 10.0, "rss_mib": 50.0},
            "after": {"cpu_s": 10.0 + cpu, "rss_mib": 52.0},
        },
    }


def test_summary_pools_rounds_and_ratios_are_ours_over_theirs() -> None:
    blocks = [
        _block("ours", 1, [1.0, 1.2], 4.0, 0.2),
        _block("theirs", 1, [0.5, 0.5], 1.0, 0.02),
        _block("ours", 1, [1.4, 1.6], 6.0, 0.4),
        _block("theirs", 1, [0.7, 0.7], 3.0, 0.02),
    ]
    figures = parts.summary(blocks)
    assert figures["ours"]["claims_1"] == {
        "pods": 4,
        "p50_ms": 1300.0,
        "p90_ms": 1400.0,
        "mean_ms": 1300.0,
        "kubelet_prepare_call_mean_ms": 5.0,
        "agent_cpu_ms_per_pod": 150.0,
        "agent_rss_mib_after": 52.0,
    }
    ratios = parts.ratios(figures)["claims_1"]
    assert ratios["p50_ms"] == round(1300 / 600, 2)
    assert ratios["kubelet_prepare_call_mean_ms"] == 2.5
    assert ratios["agent_cpu_ms_per_pod"] == 15.0
    assert "pods" not in ratios
    assert parts.ratios({"ours": figures["ours"]}) == {}
