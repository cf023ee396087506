"""Claims for tests, created and allocated through the official client, as the scheduler would."""

import uuid
from typing import Any

from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME


def claim_body(name: str, requests: list[str], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": request, "exactly": {"deviceClassName": "gpu.dra-driver.dev"}}
                    for request in requests
                ]
            }
        },
    }


def allocate(
    api: client.ResourceV1Api,
    name: str,
    devices: dict[str, str],
    pool: str,
    namespace: str = "default",
    driver: str = DEFAULT_DRIVER_NAME,
) -> str:
    """Creates claim `name` with one request per entry of `devices` (request -> device), allocates
    it on `pool`, and returns its UID."""
    api.create_namespaced_resource_claim(namespace, claim_body(name, sorted(devices), namespace))
    stored = api.read_namespaced_resource_claim(name, namespace)
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": request, "driver": driver, "pool": pool, "device": device}
                    for request, device in sorted(devices.items())
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}],
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": stored.metadata.resource_version,
        },
        "spec": client.ApiClient().sanitize_for_serialization(stored.spec),
        "status": status,
    }
    api.replace_namespaced_resource_claim_status(name, namespace, body)
    uid: str = stored.metadata.uid
    return uid
