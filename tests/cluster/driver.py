"""The driver on the local cluster as the chart installs it: the chart's objects applied to the
real API server by real Helm (helm-sdkpy), the agent as the chart's DaemonSet pod from the image
built here, on the mock NVIDIA driver; then a wait for its ResourceSlices.

The values are the kind e2e setup's (tests/e2e/deploy.py: hardware nvml on the mock, the e2e
node config, the mock's environment) with kubelet's directories where this cluster's kubelet
keeps them.
"""

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.tools.manifests import DEFAULT_NAMESPACE, chart_values
from tests.cluster.layout import NODE_NAME, Layout
from tests.cluster.versions import KubernetesVersion
from tests.e2e.deploy import CHART, NODE_LABEL, RELEASE, e2e_options

DAEMON_SET = RELEASE


class DriverError(Exception):
    pass


def local_values(image: str, layout: Layout, version: KubernetesVersion) -> dict[str, Any]:
    options = msgspec.structs.replace(
        e2e_options(image),
        registrar_dir=str(layout.registrar_dir),
        plugins_dir=str(layout.plugins_dir),
        kubernetes_version=version.minor,
    )
    values = chart_values(options)
    values["usage"]["podResourcesDir"] = str(layout.pod_resources_dir)
    return values


def run_kubectl(kubectl: list[str], *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    completed = subprocess.run(
        [*kubectl, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if completed.returncode != 0:
        raise DriverError(
            f"kubectl {' '.join(args)} exited {completed.returncode}: {completed.stderr.strip()}"
        )
    return completed.stdout


def prepare_node(kubectl: list[str]) -> None:
    """The node labelled for the agent; the agent's namespace labelled privileged for Pod
    Security (the chart leaves the namespace to the operator, as docs/install.md says)."""
    run_kubectl(kubectl, "label", "--overwrite", "node", NODE_NAME, "=".join(NODE_LABEL))
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": DEFAULT_NAMESPACE,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
        },
    }
    run_kubectl(kubectl, "apply", "-f", "-", stdin=json.dumps(namespace))


async def _helm_upgrade(kubeconfig: Path, values: dict[str, Any]) -> str:
    import helm_sdkpy  # noqa: PLC0415 - the Helm library loads a Go shared object: only here

    config = helm_sdkpy.Configuration(namespace=DEFAULT_NAMESPACE, kubeconfig=str(kubeconfig))
    result = await helm_sdkpy.Upgrade(config).run(
        RELEASE, str(CHART), values=values, install=True, wait=False, timeout=180
    )
    return f"release {RELEASE} revision {result.get('version')}: {result.get('info', {}).get('status')}"


def install_chart(kubeconfig: Path, values: dict[str, Any]) -> str:
    """`helm upgrade --install`: a second run with a new image rolls the agent out."""
    return asyncio.run(_helm_upgrade(kubeconfig, values))


def wait_for_rollout(kubectl: list[str], timeout: float = 240) -> None:
    try:
        run_kubectl(
            kubectl, "rollout", "status", "--namespace", DEFAULT_NAMESPACE, f"daemonset/{DAEMON_SET}",
            f"--timeout={int(timeout)}s", timeout=timeout + 10,
        )  # fmt: skip
    except DriverError as error:
        described = subprocess.run(
            [*kubectl, "describe", "pods", "--namespace", DEFAULT_NAMESPACE],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        raise DriverError(f"{error}\n{described[-4000:]}") from error


def slices(kubectl: list[str]) -> list[dict[str, Any]]:
    listed = json.loads(
        run_kubectl(
            kubectl,
            "get",
            "resourceslices",
            "-o",
            "json",
            "--field-selector",
            f"spec.driver={DEFAULT_DRIVER_NAME},spec.nodeName={NODE_NAME}",
        )
    )
    items: list[dict[str, Any]] = listed["items"]
    return items


def wait_for_slices(kubectl: list[str], timeout: float = 120) -> int:
    """The number of devices published, once there are any."""
    deadline = time.monotonic() + timeout
    while True:
        devices = sum(len(item["spec"].get("devices", [])) for item in slices(kubectl))
        if devices:
            return devices
        if time.monotonic() > deadline:
            raise DriverError(
                f"no ResourceSlices of {DEFAULT_DRIVER_NAME} on {NODE_NAME} after {timeout:.0f}s"
            )
        time.sleep(1)
