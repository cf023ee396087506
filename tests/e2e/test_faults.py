"""Faults on the local cluster (python -m tests.cluster.e2e): the agent killed while kubelet
prepares, kubelet, containerd and the API server restarted under running pods, and an XID in the
mock driver that taints the device so that the real eviction controller evicts the pod.

They drive the cluster's own processes, so they need the local provider (E2E_PROVIDER=local,
which tests/cluster/e2e.py sets); on kind they are not collected.
"""

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.edits.cdi import claim_spec_prefix
from tests.cluster import control_plane, processes
from tests.cluster.layout import HOST_CDI_DIR, Layout
from tests.e2e import kube
from tests.e2e.deploy import RELEASE
from tests.e2e.mock_driver import MOCK_DIR

if os.environ.get("E2E_PROVIDER") != "local":
    pytest.skip("the fault tests drive the local cluster's processes (make e2e)", allow_module_level=True)

LAYOUT = Layout.from_environment()
AGENT_NAMESPACE = "dra-driver"


def _claim_specs() -> set[str]:
    prefix = claim_spec_prefix(DEFAULT_DRIVER_NAME)
    return {path.name for path in HOST_CDI_DIR.glob(f"{prefix}*")} if HOST_CDI_DIR.is_dir() else set()


def _agent_pids() -> list[int]:
    """The agent container's main process, seen from the host."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) >= 3 and argv[1].endswith(b"/dra-driver") and argv[2] == b"node":
                found.append(int(entry.name))
    return found


def _agent_ready(timeout: float = 120) -> None:
    kube.kubectl(
        "rollout",
        "status",
        "--namespace",
        AGENT_NAMESPACE,
        f"daemonset/{RELEASE}",
        f"--timeout={int(timeout)}s",
    )


def _node_ready(timeout: float = 120) -> None:
    kube.kubectl("wait", "--for=condition=Ready", "node", "--all", f"--timeout={int(timeout)}s")


def test_a_pod_prepared_while_the_agent_is_killed_starts_once_it_is_back(run_example: Any) -> None:
    before = _claim_specs()
    (pid,) = _agent_pids()
    os.kill(pid, signal.SIGKILL)
    # kubelet's prepare finds no plugin until the DaemonSet's container is back, then retries.
    run = run_example("gpu-whole")

    (result,) = run.results
    assert result["driver"] == DEFAULT_DRIVER_NAME
    assert _agent_pids() and _agent_pids() != [pid]
    _agent_ready()
    # The pod has finished: its claim is unprepared, so no spec of it is left.
    deadline = time.monotonic() + 60
    while _claim_specs() - before and time.monotonic() < deadline:
        time.sleep(1)
    assert _claim_specs() - before == set()


@pytest.mark.parametrize("service", ["kubelet", "containerd", "kube-apiserver"])
def test_a_restarted_component_leaves_the_running_pod_and_its_claim_alone(
    service: str, long_running: Callable[[str], dict[str, Any]], run_example: Any, namespace: str
) -> None:
    pod = long_running(f"survives-{service}")
    specs = _claim_specs()
    assert specs, "the running pod's claim has a CDI spec"

    processes.restart(LAYOUT, service)
    # A restarted API server refuses connections until it is ready again.
    processes.wait_until("ready", lambda: control_plane.api_ready(LAYOUT), 120, LAYOUT, "kube-apiserver")
    _node_ready()
    _agent_ready()

    after = kube.get("pod", pod["metadata"]["name"], "--namespace", namespace)
    assert after["status"]["phase"] == "Running"
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert specs <= _claim_specs()
    # And the node still prepares: a new example runs to completion.
    (result,) = run_example("cel-selection").results
    assert result["driver"] == DEFAULT_DRIVER_NAME


def test_an_xid_taints_the_device_and_the_eviction_controller_evicts_the_pod(
    long_running: Callable[[str], dict[str, Any]], namespace: str, worker: str
) -> None:
    pod = long_running("xid-victim")
    watch = kube.ClaimWatch(namespace)
    try:
        (result,) = kube.allocation_results(pod, watch)
    finally:
        watch.stop()
    device = kube.published_devices(worker)[result["device"]]
    index = next(iter(device["attributes"]["index"].values()))

    # XID 48 (double-bit ECC) is fatal: NoExecute on every device of the GPU.
    (Path(MOCK_DIR) / "faults" / f"xid-1-{index}-48").touch()

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        taints = kube.published_devices(worker)[result["device"]].get("taints", [])
        gone = kube.kubectl(
            "get", "pod", pod["metadata"]["name"], "--namespace", namespace, "--ignore-not-found"
        )
        if any(taint["effect"] == "NoExecute" for taint in taints) and not gone.strip():
            break
        time.sleep(2)
    else:
        raise AssertionError(f"device {result['device']} tainted {taints}, pod still there: {gone}")
