"""Pods started and stopped one at a time on the local cluster, timed from the create request to
the watch event that shows them Running, as a user waiting on `kubectl wait` would see it; and
kubelet's own figures for the DRA calls it made meanwhile (its /metrics, through the API server's
node proxy)."""

import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client, watch

from tests.cluster.layout import NODE_NAME
from tests.e2e.objects import claim_template

NAMESPACE = "pod-start"
WHOLE_GPU = "whole-gpu"
MIG_1G = "mig-1g10gb"
CLAIM_TIMEOUT_SECONDS = 120.0
_SERIES = re.compile(
    r"^(?P<name>dra_[a-z_]+_seconds)_(?P<part>sum|count)\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
)


_PROFILE_1G_10GB = 'device.attributes["gpu.dra-driver.dev"].profile == "1g.10gb"'


def namespaced_template(name: str, request: dict[str, Any]) -> dict[str, Any]:
    """The e2e tier's claim template of one request named "device", in the benchmark's namespace."""
    template = claim_template(name, request, request_name="device")
    template["metadata"]["namespace"] = NAMESPACE
    return template


def templates() -> list[dict[str, Any]]:
    whole = {"deviceClassName": "gpu.dra-driver.dev"}
    mig = {
        "deviceClassName": "mig.dra-driver.dev",
        "selectors": [
            {"cel": {"expression": 'device.attributes["gpu.dra-driver.dev"].profile == "1g.10gb"'}}
        ],
    }
    return [namespaced_template(name, request) for name, request in ((WHOLE_GPU, whole), (MIG_1G, mig))]


def pod(name: str, template: str, claims: int) -> dict[str, Any]:
    """A pod whose one container holds `claims` claims made from `template` and sleeps."""
    names = [f"c{index}" for index in range(claims)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            # Deleted gracefully (see stop_pod), it ends at once on SIGTERM.
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": claim, "resourceClaimTemplateName": template} for claim in names],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    "resources": {"claims": [{"name": claim} for claim in names]},
                }
            ],
        },
    }


class Cluster:
    """The API calls of the benchmark, through the official client and the admin kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import config  # noqa: PLC0415

        configuration = client.Configuration()
        # Loaded before the client is made: the client's connection pool takes the CA from it.
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.objects = client.CustomObjectsApi(self.api)

    def set_up(self) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        except client.ApiException as error:
            if error.status != 409:
                raise
        wait_until(self._has_service_account, 60, "the namespace's default service account")
        # What an interrupted run left: its pods would hold devices, and their names are reused.
        self.core.delete_collection_namespaced_pod(NAMESPACE)
        wait_until(self._empty, CLAIM_TIMEOUT_SECONDS, f"no pods or claims left in {NAMESPACE}")
        for template in templates():
            try:
                self.objects.create_namespaced_custom_object(
                    "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", template
                )
            except client.ApiException as error:
                if error.status != 409:
                    raise

    def _empty(self) -> bool:
        pods = self.core.list_namespaced_pod(NAMESPACE).items
        return not pods and not self.resource.list_namespaced_resource_claim(NAMESPACE).items

    def _has_service_account(self) -> bool:
        try:
            self.core.read_namespaced_service_account("default", NAMESPACE)
        except client.ApiException:
            return False
        return True

    def start_pod(
        self, name: str, template: str, claims: int, timeout: float = CLAIM_TIMEOUT_SECONDS
    ) -> float:
        """Seconds from the create request to Running."""
        started = time.monotonic()
        created = self.core.create_namespaced_pod(NAMESPACE, pod(name, template, claims))
        stream = watch.Watch()
        try:
            for event in stream.stream(
                self.core.list_namespaced_pod,
                NAMESPACE,
                field_selector=f"metadata.name={name}",
                resource_version=created.metadata.resource_version,
                timeout_seconds=int(timeout),
            ):
                phase = event["object"].status.phase
                if phase == "Running":
                    return time.monotonic() - started
                if phase in ("Failed", "Succeeded"):
                    raise RuntimeError(f"pod {name} ended {phase} before it ran: {event['object'].status}")
        finally:
            stream.stop()
        raise TimeoutError(f"pod {name} not Running after {timeout:.0f}s: {self._describe(name)}")

    def stop_pod(self, name: str, timeout: float = CLAIM_TIMEOUT_SECONDS) -> None:
        """Deletes the pod and waits until it and its claims are gone (the claims' devices free
        for the next pod). Gracefully: a pod deleted with grace period 0 leaves the API at once,
        its claims are deallocated and their devices allocated to the next pod while kubelet has
        yet to stop its container and unprepare them; the driver refuses that prepare (the device
        is still in use) and kubelet's retry backs off for tens of seconds."""
        self.core.delete_namespaced_pod(name, NAMESPACE)
        wait_until(lambda: self._gone(name), timeout, f"pod {name} and its claims gone")

    def _gone(self, name: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, NAMESPACE)
            return False
        except client.ApiException as error:
            if error.status != 404:
                raise
        claims = self.resource.list_namespaced_resource_claim(NAMESPACE).items
        return not any(claim.metadata.name.startswith(f"{name}-") for claim in claims)

    def _describe(self, name: str) -> str:
        try:
            return str(self.core.read_namespaced_pod(name, NAMESPACE).status)
        except client.ApiException as error:
            return f"(unreadable: {error.status})"

    def kubelet_dra_seconds(self, driver: str) -> dict[str, tuple[float, float]]:
        """Kubelet's DRA duration histograms for `driver`: series -> (sum of seconds, count)."""
        text = self.core.connect_get_node_proxy_with_path(NODE_NAME, "metrics")
        return dra_series(text, driver)


def dra_series(text: str, driver: str) -> dict[str, tuple[float, float]]:
    """The sums and counts of kubelet's `dra_*_seconds` histograms whose labels name `driver`
    (or no driver: the operation-level ones), keyed by name and labels."""
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match is None:
            continue
        labels = match["labels"]
        if "driver_name=" in labels and f'driver_name="{driver}"' not in labels:
            continue
        found.setdefault(f"{match['name']}{{{labels}}}", {})[match["part"]] = float(match["value"])
    return {key: (parts.get("sum", 0.0), parts.get("count", 0.0)) for key, parts in found.items()}


def mean_per_call(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Per series, the calls made between two readings and their mean in milliseconds."""
    means = {}
    for key, (total, count) in after.items():
        earlier_total, earlier_count = before.get(key, (0.0, 0.0))
        calls = count - earlier_count
        if calls > 0:
            means[key] = {"calls": calls, "mean_ms": round((total - earlier_total) / calls * 1000, 3)}
    return means


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.1)


def refused_start(program: str, pods: int, rounds: int) -> int | None:
    """The exit code of a run that cannot start with these arguments or this user, after one line
    saying why (2 for an argument, 1 for not being root); None when it can."""
    if pods < 1 or rounds < 1:
        print(f"{program}: --pods and --rounds: expected at least 1", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print(
            f"{program}: run as root: the local cluster's kubelet, containerd and runc need it",
            file=sys.stderr,
        )
        return 1
    return None
