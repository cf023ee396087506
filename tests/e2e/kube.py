"""kubectl, run as a subprocess against the e2e cluster: the few calls the e2e tests make.

The cluster is kubectl's current context, or E2E_KUBE_CONTEXT (hack/e2e.sh sets it to the kind
cluster's context).
"""

import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
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


def apply_objects(objects: Sequence[Mapping[str, Any]], namespace: str | None) -> None:
    text = yaml.safe_dump_all([dict(item) for item in objects], sort_keys=False)
    kubectl("apply", *_namespace_args(namespace), "--filename", "-", stdin=text)


def delete_file(path: Path, namespace: str | None) -> None:
    """Waits until the objects are gone, so that the devices of their claims are free again."""
    kubectl("delete", *_namespace_args(namespace), "--filename", str(path), "--ignore-not-found", "--wait")


def delete(kind: str, name: str, namespace: str | None) -> None:
    kubectl("delete", *_namespace_args(namespace), kind, name, "--ignore-not-found", "--wait")


def wait_for_service_account(namespace: str, timeout: float = 60) -> None:
    """The controller-manager creates a namespace's `default` ServiceAccount a moment after the
    namespace; a pod created before it is refused by the ServiceAccount admission plugin."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kubectl("get", "serviceaccount", "default", "--namespace", namespace)
            return
        except KubectlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


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


class ClaimWatch:
    """Every allocated version of the namespace's ResourceClaims, from a `kubectl get --watch`
    started before the example is applied, by the pod that owns the claim or that it is
    reserved for.

    The real resourceclaim controller taught us two things: it deallocates and deletes a claim
    made from a template as soon as its pod has finished (the examples' pods run for a second,
    so reading the claim afterwards finds nothing), and on 1.37 it then makes a new claim for the
    finished pod, never allocated, and points the pod's status.resourceClaimStatuses at that one.
    """

    def __init__(self, namespace: str) -> None:
        context = os.environ.get("E2E_KUBE_CONTEXT")
        self._process = subprocess.Popen(
            [
                "kubectl", *(["--context", context] if context else []), "get",
                "resourceclaims.resource.k8s.io", "--namespace", namespace, "--watch", "--output", "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        # pod UID -> claim name -> the claim's last allocated version
        self.allocated: dict[str, dict[str, dict[str, Any]]] = {}
        # claim name -> the last status.devices seen (KEP-4817: the driver reports each device)
        self.device_status: dict[str, list[dict[str, Any]]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._process.stdout:
            buffer += line
            while buffer.strip():
                try:
                    item, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                if not item.get("status", {}).get("allocation"):
                    continue
                for pod_uid in {pod["uid"] for pod in _pods_of(item)}:
                    self.allocated.setdefault(pod_uid, {})[item["metadata"]["name"]] = item
                if item["status"].get("devices"):
                    self.device_status[item["metadata"]["name"]] = item["status"]["devices"]

    def claims_of(self, pod: Mapping[str, Any], timeout: float = 30) -> list[dict[str, Any]]:
        """The pod's claims as they were allocated, one per claim of its spec."""
        expected = len(pod["spec"].get("resourceClaims", []))
        deadline = time.monotonic() + timeout
        while True:
            seen = list(self.allocated.get(pod["metadata"]["uid"], {}).values())
            if len(seen) >= expected:
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pod {pod['metadata']['name']}: {len(seen)} of {expected} claims seen allocated"
                )
            time.sleep(0.2)

    def allocated_uids(self, pod_names: Iterable[str]) -> set[str]:
        """The UIDs of every claim seen allocated for a pod of one of these names (the namespace
        may hold other tests' pods, whose claims are theirs to wait for)."""
        names = set(pod_names)
        return {
            claim["metadata"]["uid"]
            for claims in self.allocated.values()
            for claim in claims.values()
            if any(pod["name"] in names for pod in _pods_of(claim))
        }

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


def _pods_of(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pods a claim is for: the one that owns it (made from its template), and those it is
    reserved for (a ResourceClaim that several pods name)."""
    owners = [owner for owner in claim["metadata"].get("ownerReferences", []) if owner["kind"] == "Pod"]
    reserved = [
        entry for entry in claim.get("status", {}).get("reservedFor", []) if entry.get("resource") == "pods"
    ]
    return [*owners, *reserved]


def allocation_results(pod: Mapping[str, Any], watch: ClaimWatch) -> list[dict[str, Any]]:
    """The allocation results of every claim of the pod that name our driver."""
    return [
        result
        for claim in watch.claims_of(pod)
        for result in claim["status"]["allocation"]["devices"]["results"]
        if result["driver"] == DEFAULT_DRIVER_NAME
    ]


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


def server_version() -> tuple[int, int]:
    """(major, minor) of the cluster's API server."""
    info = json.loads(kubectl("version", "--output", "json"))["serverVersion"]
    return int(info["major"]), int(info["minor"].rstrip("+"))
