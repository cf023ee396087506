"""Claims for tests, created and allocated through the official client, as the scheduler would."""

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME


def claim_body(
    name: str, requests: list[str], namespace: str = "default", annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {
            "devices": {
                "requests": [
                    {"name": request, "exactly": {"deviceClassName": "gpu.dra-driver.dev"}}
                    for request in requests
                ]
            }
        },
    }


def allocate_results(
    api: client.ResourceV1Api,
    name: str,
    results: Sequence[Mapping[str, Any]],
    configs: Sequence[Mapping[str, Any]] = (),
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
) -> str:
    """Creates claim `name` with the requests `results` name and writes its allocation as the
    scheduler would: `results` as given (shareID, consumedCapacity, adminAccess included) and the
    opaque `configs`. `annotations`: the claim's, as the resource claim controller sets them on
    claims it makes from a template. Returns the claim's UID."""
    requests = sorted({str(result["request"]).split("/")[0] for result in results})
    api.create_namespaced_resource_claim(namespace, claim_body(name, requests, namespace, annotations))
    stored = api.read_namespaced_resource_claim(name, namespace)
    status = {
        "allocation": {
            "devices": {"results": [dict(r) for r in results], "config": [dict(c) for c in configs]}
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
    results = [
        {"request": request, "driver": driver, "pool": pool, "device": device}
        for request, device in sorted(devices.items())
    ]
    return allocate_results(api, name, results, namespace=namespace)
