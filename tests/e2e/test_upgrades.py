"""The chart upgraded on the local cluster, as an operator does it with `helm upgrade`: a rolling
update of the agent (the chart's maxSurge 1: the new pod starts beside the old one) under a
running pod, and, where the version has them (1.36+), the `nvidia.com/gpu` extended resource
served from the DeviceClass. Local provider only: it installs through tests/cluster/driver.py.
"""

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster import agent_image, driver
from tests.cluster.layout import Layout
from tests.cluster.versions import kubernetes_version
from tests.e2e import kube
from tests.e2e.conftest import wait_phase
from tests.e2e.test_faults import AGENT_NAMESPACE
from tests.support.examples import parse_report, whole_gpu_uuids

if os.environ.get("E2E_PROVIDER") != "local":
    pytest.skip(
        "the upgrade tests install through the local cluster's harness (make e2e)", allow_module_level=True
    )

LAYOUT = Layout.from_environment()


def _agent_pods() -> dict[str, str]:
    """The agent pods, uid -> phase."""
    pods = kube.get("pods", "--namespace", AGENT_NAMESPACE, "--selector", "app.kubernetes.io/name=dra-driver")
    return {pod["metadata"]["uid"]: pod["status"].get("phase", "") for pod in pods["items"]}


@pytest.fixture
def upgrade() -> Iterator[Callable[..., None]]:
    """upgrade(**changes): `helm upgrade` with the cluster's values and `changes` on top, until
    the rollout is done; the original values are installed again afterwards."""
    version = kubernetes_version()
    _, image = agent_image.build_agent_image()
    kubeconfig = LAYOUT.kubeconfig("admin")
    kubectl = ["kubectl"]

    def run(**changes: Any) -> None:
        driver.install_chart(kubeconfig, {**driver.local_values(image, LAYOUT, version), **changes})
        driver.wait_for_rollout(kubectl)

    yield run
    run()


def test_a_rolling_update_keeps_the_running_pod_and_the_node_preparing(
    upgrade: Callable[..., None],
    long_running: Callable[[str], dict[str, Any]],
    run_example: Any,
    namespace: str,
) -> None:
    pod = long_running("survives-rollout")
    (old,) = _agent_pods()

    upgrade(podAnnotations={"e2e.dra-driver.dev/rollout": str(time.time())})

    deadline = time.monotonic() + 60
    while old in (pods := _agent_pods()) and time.monotonic() < deadline:
        time.sleep(1)
    assert old not in pods and list(pods.values()) == ["Running"], pods
    after = kube.get("pod", pod["metadata"]["name"], "--namespace", namespace)
    assert after["status"]["phase"] == "Running"
    (result,) = run_example("cel-selection").results
    assert result["device"]


def test_a_pod_asking_for_nvidia_com_gpu_gets_a_whole_gpu(
    upgrade: Callable[..., None], namespace: str
) -> None:
    if kubernetes_version().minor == "1.34":
        pytest.skip("extended resources served from DeviceClasses start in Kubernetes 1.36")
    upgrade(extendedResources={"enabled": True})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "extended-gpu"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", "echo '== env'; env | sort; echo '== /dev'; ls -1 /dev"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    kube.apply_objects([pod], namespace)
    try:
        wait_phase("extended-gpu", namespace, "Succeeded")
        report = parse_report(kube.logs("extended-gpu", namespace, "main"))
    finally:
        kube.delete("pod", "extended-gpu", namespace)
    assert len(whole_gpu_uuids(report.env)) == 1, report.env
