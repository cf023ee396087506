"""kubectl, run as a subprocess against the e2e cluster: the few calls the e2e tests make.

The cluster is kubectl's current context, or E2E_KUBE_CONTEXT (hack/e2e.sh sets it to the kind
cluster's context).
"""

import json
import os
import shlex
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME

POD_TIMEOUT = 240.0
_POLL = 2.0


class KubectlError(Exception):
    pass


def kubectl(*args: str, stdin: str | None = None, timeout: float = 300) -> str:
    context = os.environ.get("E2E_KUBE_CONTEXT")
    argv = ["kubectl", *(["--context", context] if context else []), *args]
    completed = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if completed.returncode != 0:
        raise KubectlError(f"{shlex.join(argv)} exited {completed.returncode}:\n{completed.stderr}")
    return completed.stdout


def get(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json"))


def _namespace_args(namespace: str | None) -> list[str]:
    return ["--namespace", namespace] if namespace else []


def apply_file(path: Path, namespace: str | None) -> None:
    kubectl("apply", *_namespace_args(namespace), "--filename", str(path))


def apply_objects(objects: list[Mapping[str, Any]], namespace: str | None) -> None:
    text = yaml.safe_dump_all([dict(item) for item in objects], sort_keys=False)
    kubectl("apply", *_namespace_args(namespace), "--filename", "-", stdin=text)


def delete_file(path: Path, namespace: str | None) -> None:
    """Waits until the objects are gone, so that the devices of their claims are free again."""
    kubectl("delete", *_namespace_args(namespace), "--filename", str(path), "--ignore-not-found", "--wait")


def delete(kind: str, name: str, namespace: str | None) -> None:
    kubectl("delete", *_namespace_args(namespace), kind, name, "--ignore-not-found", "--wait")


def wait_for_pod(name: str, namespace: str, timeout: float = POD_TIMEOUT) -> dict[str, Any]:
    """The pod once it has succeeded; an AssertionError with `kubectl describe` if it fails or
    does not finish in time (a claim that cannot be allocated leaves it Pending)."""
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = get("pod", name, "--namespace", namespace)
        phase = pod.get("status", {}).get("phase")
        if phase == "Succeeded":
            return pod
        if phase == "Failed" or time.monotonic() > deadline:
            described = kubectl("describe", "pod", name, "--namespace", namespace)
            raise AssertionError(f"pod {namespace}/{name} is {phase} after {timeout:.0f}s:\n{described}")
        time.sleep(_POLL)


def logs(pod: str, namespace: str, container: str) -> str:
    return kubectl("logs", pod, "--namespace", namespace, "--container", container)


def allocation_results(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The allocation results of every claim of the pod that name our driver."""
    namespace = pod["metadata"]["namespace"]
    results: list[dict[str, Any]] = []
    for status in pod["status"].get("resourceClaimStatuses", []):
        claim = get("resourceclaims.resource.k8s.io", status["resourceClaimName"], "--namespace", namespace)
        results += [
            result
            for result in claim["status"]["allocation"]["devices"]["results"]
            if result["driver"] == DEFAULT_DRIVER_NAME
        ]
    return results


def published_devices(node: str) -> dict[str, dict[str, Any]]:
    """The devices in our driver's ResourceSlices for `node`, by name."""
    slices = get(
        "resourceslices.resource.k8s.io",
        "--field-selector",
        f"spec.driver={DEFAULT_DRIVER_NAME},spec.nodeName={node}",
    )
    return {
        device["name"]: device
        for resource_slice in slices["items"]
        for device in resource_slice["spec"].get("devices", [])
    }
