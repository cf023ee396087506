"""The ResourceClaim the scheduler writes for a pod that asks for an extended resource backed by
DRA (KEP-5004), built and allocated here as the scheduler builds and allocates it.

Facts, read in kubernetes/kubernetes pkg/scheduler/framework/plugins/dynamicresources/
extendeddynamicresources.go (1.36/1.37, master of 2026) and k8s.io/api resource/v1 types.go:

- One claim per pod for all its DRA-backed extended resources, in the pod's namespace, created
  only at PreBind: `metadata.generateName: <pod name>-extended-resources-` (the server adds the
  random suffix and trims a long base), annotation `resource.kubernetes.io/extended-resource-claim:
  "true"` (the only valid value; it is how the scheduler finds the claim again), and one
  ownerReference `{apiVersion: v1, kind: Pod, name, uid, controller: true}`, so the claim is
  garbage-collected with the pod.
- A resource is DRA-backed on a node when some DeviceClass names it (`spec.extendedResourceName`,
  or implicitly `deviceclass.resource.kubernetes.io/<class>`) and the node's
  `status.allocatable` does not have it: a node where a device plugin advertises nvidia.com/gpu
  gets the device plugin's devices instead, which is why the two must never share a node.
- `spec.devices.requests`: one `exactly` request per (container, resource) with
  `deviceClassName` (the class), `allocationMode: ExactCount` and `count` = the container's
  request (extended resources are integers; requests default to limits), named
  `container-<i>-request-<j>`: i the container's index in initContainers followed by containers,
  j the resource's index among the container's *sorted* request names (cpu and memory count
  too). Requests are sorted by name. Regular containers and sidecars (init containers with
  restartPolicy Always) get their own requests; a plain init container first reuses the requests
  of containers after it, and only the largest remainder among plain init containers becomes a
  request, which the others map to as well.
- The pod's `status.extendedResourceClaimStatus` = {`resourceClaimName`, `requestMappings[]` of
  {containerName, resourceName, requestName}} tells kubelet which container gets which request's
  devices (kubelet passes their CDI IDs to that container, as for `resources.claims`).
- The allocation is written like any other: results `{request: container-0-request-0, driver,
  pool, device}`, the finalizer `resource.kubernetes.io/delete-protection`, and
  `status.reservedFor: [{resource: pods, name, uid}]`.
"""

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
FINALIZER = "resource.kubernetes.io/delete-protection"


@dataclass(frozen=True)
class RequestMapping:
    container_name: str
    resource_name: str
    request_name: str


@dataclass(frozen=True)
class ExtendedClaim:
    """The claim body to create, and what the scheduler writes into the pod's status."""

    body: dict[str, Any]
    mappings: tuple[RequestMapping, ...]


def _requests_of(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests after API defaulting: a limit without a request is the request."""
    resources = container.get("resources", {})
    return {**resources.get("limits", {}), **resources.get("requests", {})}


def _container_request(
    index: int,
    container: Mapping[str, Any],
    resource: str,
    class_name: str,
    reusable: Sequence[dict[str, Any] | None],
) -> tuple[dict[str, Any] | None, list[RequestMapping]]:
    requests = _requests_of(container)
    wanted = int(requests.get(resource, 0))
    if wanted == 0:
        return None, []
    mappings: list[RequestMapping] = []
    covered = 0
    for request in reusable:
        if request is None:
            continue
        covered += request["exactly"]["count"]
        mappings.append(RequestMapping(container["name"], resource, request["name"]))
        if covered >= wanted:
            return None, mappings
    name = f"container-{index}-request-{sorted(requests).index(resource)}"
    request = {
        "name": name,
        "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": wanted - covered},
    }
    return request, [*mappings, RequestMapping(container["name"], resource, name)]


def _requests_and_mappings(
    pod: Mapping[str, Any], class_of: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[RequestMapping]]:
    spec = pod["spec"]
    init = list(spec.get("initContainers", []))
    containers = [*init, *spec["containers"]]
    short_lived = [
        i for i, c in enumerate(containers) if i < len(init) and c.get("restartPolicy") != "Always"
    ]
    long_lived = [i for i in range(len(containers)) if i not in short_lived]
    all_requests: list[dict[str, Any]] = []
    all_mappings: list[RequestMapping] = []
    for resource in sorted(class_of):
        long_requests: list[dict[str, Any] | None] = [None] * len(containers)
        long_mappings: list[RequestMapping] = []
        for i in long_lived:
            request, mappings = _container_request(i, containers[i], resource, class_of[resource], [])
            long_requests[i] = request
            long_mappings += mappings
        largest: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_mappings: list[RequestMapping] = []
        for i in short_lived:
            request, mappings = _container_request(
                i, containers[i], resource, class_of[resource], long_requests[i:]
            )
            if request is not None:
                short_names.add(request["name"])
                if largest is None or largest["exactly"]["count"] < request["exactly"]["count"]:
                    largest = request
            short_mappings += mappings
        if largest is not None:
            short_mappings = [
                RequestMapping(m.container_name, m.resource_name, largest["name"])
                if m.request_name in short_names
                else m
                for m in short_mappings
            ]
            all_requests.append(largest)
        all_requests += [request for request in long_requests if request is not None]
        all_mappings += long_mappings + short_mappings
    return sorted(all_requests, key=lambda request: request["name"]), all_mappings


def extended_resource_claim(pod: Mapping[str, Any], class_of: Mapping[str, str]) -> ExtendedClaim:
    """The claim for `pod` (a Pod object with metadata.uid), where `class_of` maps each of the
    pod's DRA-backed extended resources (on the chosen node) to the DeviceClass naming it."""
    metadata = pod["metadata"]
    requests, mappings = _requests_and_mappings(pod, class_of)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{metadata['name']}-extended-resources-",
            "namespace": metadata.get("namespace", "default"),
            "annotations": {ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": requests}},
    }
    return ExtendedClaim(body, tuple(mappings))


def gpu_pod(name: str, limits: Mapping[str, int], containers: int = 1) -> dict[str, Any]:
    """A pod written for the NVIDIA device plugin: each container asks by `resources.limits`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "containers": [
                {
                    "name": f"main-{number}" if number else "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {resource: str(count) for resource, count in limits.items()}},
                }
                for number in range(containers)
            ]
        },
    }


def create_and_allocate(
    api: client.ResourceV1Api,
    claim: ExtendedClaim,
    pod: Mapping[str, Any],
    devices: Mapping[str, Sequence[str]],
    driver: str,
    pool: str,
) -> tuple[str, str]:
    """Creates the claim through the API (its name from generateName) and writes the allocation
    the scheduler writes at PreBind: `devices` maps each request name to the devices chosen for
    it. Returns the claim's name and UID."""
    namespace = claim.body["metadata"]["namespace"]
    created = api.create_namespaced_resource_claim(
        namespace, {**claim.body, "metadata": {**claim.body["metadata"], "finalizers": [FINALIZER]}}
    )
    results = [
        {"request": request, "driver": driver, "pool": pool, "device": device}
        for request in sorted(devices)
        for device in devices[request]
    ]
    status = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": created.metadata.name,
            "namespace": namespace,
            "resourceVersion": created.metadata.resource_version,
        },
        "spec": client.ApiClient().sanitize_for_serialization(created.spec),
        "status": status,
    }
    api.replace_namespaced_resource_claim_status(created.metadata.name, namespace, body)
    return created.metadata.name, created.metadata.uid
