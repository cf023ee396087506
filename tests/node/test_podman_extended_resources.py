"""A pod written for the NVIDIA device plugin (`resources.limits: {nvidia.com/gpu: 1}`), run on
DRA: the claim the scheduler writes for it (tests/support/extended_claims.py), with devices its
class selects, is prepared by a real agent over kubelet's gRPC, and podman starts a container
with the CDI IDs prepare returned. The container must see the device the claim holds, in its
environment and in its device metadata file (KEP-5304).

Where that file is, for a claim the scheduler made (facts read in kubernetes/dynamic-resource-
allocation api/metadata doc.go and its metadata helper, and the 5304 KEP, November 2026; the KEP
says nothing of extended-resource claims, so the general rule applies): the layout is chosen from
the claim alone. Only a claim with the annotation resource.kubernetes.io/pod-claim-name (set by
the resource claim controller on claims made from a ResourceClaimTemplate) goes under
resourceclaimtemplates/<podClaimName>/; every other claim, the scheduler's extended-resource claim
among them (its only annotation is resource.kubernetes.io/extended-resource-claim: "true", and no
pod.spec.resourceClaims entry names it), goes under resourceclaims/<claim name>/, and its file has
no podClaimName. So the path is
/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim name>/<request>/<driver>-metadata.json
with the generated claim name from pod.status.extendedResourceClaimStatus.resourceClaimName and
the request (container-<i>-request-<j>) from its requestMappings entry for the container and the
resource. Neither is in the pod spec, so a workload learns them from the pod's status (or lists
the resourceclaims directory, where only its own claims' files are mounted).
"""

import json
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from dra_driver.devices.classes import device_classes
from dra_driver.devices.extended_resources import ExtendedResources
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import device_to_api
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.tools import kubelet_client, podman
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support import podman_tier
from tests.support.agent import NODE_NAME, AgentProcess
from tests.support.cel import selects
from tests.support.device_metadata_schema import metadata_stream, validate_metadata
from tests.support.extended_claims import ExtendedClaim, create_and_allocate, extended_resource_claim, gpu_pod

pytestmark = pytest.mark.podman

# This module's own driver name: its specs in /var/run/cdi cannot clash with another test's.
DRIVER = "gpu.podman-extended.dra-driver.dev"
HARDWARE = "mixed"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
SEPARATOR = "----"
# Static MIG on GPUs 0-1 (as the profile has them), dynamic MIG on 2-3, whole GPUs on 4-7.
NODE_CONFIG = "gpus:\n  - {index: 2, mode: mig-dynamic}\n  - {index: 3, mode: mig-dynamic}\n"
GPUS = simulated_gpus(NODE_NAME, resolve_node_spec(HARDWARE))
CLASSES = {
    device_class["spec"]["extendedResourceName"]: device_class
    for device_class in device_classes(DRIVER, ExtendedResources(("1g.10gb",)))
    if "extendedResourceName" in device_class["spec"]
}


def chosen_device(resource: str) -> str:
    """The first device the resource's class selects on the node, as the allocator may pick it."""
    expression = CLASSES[resource]["spec"]["selectors"][0]["cel"]["expression"]
    inventory = node_inventory(GPUS, parse_node_config(yaml.safe_load(NODE_CONFIG), "node config"))
    return next(d.name for d in inventory.devices if selects(expression, DRIVER, device_to_api(d)))


def metadata_path(claim: ExtendedClaim, claim_name: str, container: str, resource: str) -> str:
    """Where `container` reads the file of its `resource`, from what the scheduler writes into the
    pod's status.extendedResourceClaimStatus: `claim_name` (resourceClaimName) and the request that
    requestMappings (`claim.mappings`) gives the container and resource (see the module docstring)."""
    (request,) = [
        m.request_name for m in claim.mappings if (m.container_name, m.resource_name) == (container, resource)
    ]
    return f"{CONTAINER_DIR}/resourceclaims/{claim_name}/{request}/{DRIVER}-metadata.json"


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[AgentProcess, client.ResourceV1Api]]:
    podman_tier.require_podman()
    with podman_tier.simulated_node(DRIVER, HARDWARE, NODE_CONFIG) as node:
        yield node


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"])
async def test_a_device_plugin_pod_sees_the_device_of_its_extended_resource_claim_and_reads_its_metadata(
    resource: str, node: tuple[AgentProcess, client.ResourceV1Api]
) -> None:
    agent, claims_api = node
    pod = gpu_pod("legacy", {resource: 1})
    device = chosen_device(resource)
    extended = extended_resource_claim(pod, {resource: CLASSES[resource]["metadata"]["name"]})
    name, uid = create_and_allocate(
        claims_api,
        extended,
        pod,
        {"container-0-request-0": [device]},
        DRIVER,
        NODE_NAME,
    )
    claim = ClaimArg("default", name, uid)
    socket = agent.dirs.dra_socket
    answer = (await kubelet_client.prepare(socket, "v1", [claim]))["claims"][uid]
    try:
        assert answer["error"] == ""
        (prepared,) = answer["devices"]
        assert (prepared["request_names"], prepared["device_name"]) == (["container-0-request-0"], device)
        path = metadata_path(extended, name, "main", resource)
        script = f"env | grep ^DRA_ | sort; echo {SEPARATOR}; cat {path}"
        env_lines, metadata = podman.run_with_cdi_devices(prepared["cdi_device_ids"], script).split(
            f"{SEPARATOR}\n"
        )
    finally:
        unprepared = (await kubelet_client.unprepare(socket, "v1", [claim]))["claims"][uid]

    assert unprepared["error"] == ""
    seen = env_lines.splitlines()
    prefix = "DRA_DEVICE_" + device.upper().replace("-", "_")
    if resource == "nvidia.com/gpu":
        assert device == "gpu-4"
        assert seen == [f"{prefix}={GPUS[4].uuid}", f"{prefix}_PRODUCT_NAME={GPUS[4].product_name}"]
        expected = {"uuid": {"string": GPUS[4].uuid}, "type": {"string": "gpu"}}
    else:
        identity = {entry.partition("=")[0]: entry.partition("=")[2] for entry in seen}
        assert identity[prefix].startswith("MIG-")
        assert identity[f"{prefix}_PROFILE"] == "1g.10gb"
        assert identity[f"{prefix}_PARENT"] in {gpu.uuid for gpu in GPUS}
        expected = {
            "uuid": {"string": identity[prefix]},
            "type": {"string": "mig"},
            "profile": {"string": "1g.10gb"},
            "parentUUID": {"string": identity[f"{prefix}_PARENT"]},
        }
    check_metadata(metadata, name, uid, prepared["request_names"][0], device, expected)


def check_metadata(
    content: str, name: str, uid: str, request: str, device: str, expected: dict[str, dict[str, str]]
) -> None:
    """The file says what the claim holds: the claim, its one request and device, with the same
    identity the environment gave (`expected` attributes), in each API version."""
    stream = metadata_stream(content.encode())
    assert [document["apiVersion"] for document in stream] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    for document in stream:
        validate_metadata(document)
        assert document["metadata"] == {"name": name, "namespace": "default", "uid": uid, "generation": 1}
        assert "podClaimName" not in document, json.dumps(document)
        ((listed,),) = [[(r["name"], r["devices"]) for r in document["requests"]]]
        assert listed[0] == request
        (entry,) = listed[1]
        assert (entry["driver"], entry["pool"], entry["name"]) == (DRIVER, NODE_NAME, device)
        assert {key: entry["attributes"].get(key) for key in expected} == expected
