"""The objects the benchmark makes: kwok's fake Nodes, one ResourceClaimTemplate per need, and
pods that use them as users write them."""

from typing import Any

from tests.bench.cluster_scale.harness import KWOK_ANNOTATION
from tests.bench.cluster_scale.needs import REQUEST, Need

CLAIM = "gpu"
# More pods than any node holds here (about 20 at once), so only devices limit placement.
PODS_PER_NODE = "500"


def fake_node(name: str, kubelet_version: str) -> dict[str, Any]:
    resources = {"cpu": "256", "memory": "2Ti", "pods": PODS_PER_NODE}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
        },
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "nodeInfo": {
                "kubeletVersion": kubelet_version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def claim_template(name: str, need: Need, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": REQUEST, "exactly": need.api_request(driver)}]}}},
    }


# Held by the replay until the pod's turn: its claim is made from the template while it waits.
TURN_GATE = "bench.dra-driver.dev/turn"


def pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": TURN_GATE}],
            "terminationGracePeriodSeconds": 0,
            # No token volume: the pod never runs a process, and the namespace's CA ConfigMap need not exist.
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "busybox:1.37", "resources": {"claims": [{"name": CLAIM}]}}
            ],
        },
    }


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
