"""A pod written for the NVIDIA device plugin (`resources.limits: {nvidia.com/gpu: 1}`), run on
DRA: the claim the scheduler writes for it (tests/support/extended_claims.py), with devices its
class selects, is prepared by a real agent over kubelet's gRPC, and podman starts a container
with the CDI IDs prepare returned. The container must see the device the claim holds."""

import asyncio
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from dra_driver.devices.classes import device_classes
from dra_driver.devices.extended_resources import ExtendedResources
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import device_to_api
from dra_driver.devices.node_config import parse_node_config
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.tools import kubelet_client, podman
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support import podman_tier
from tests.support.agent import NODE_NAME, AgentProcess
from tests.support.cel import selects
from tests.support.extended_claims import create_and_allocate, extended_resource_claim, gpu_pod

pytestmark = pytest.mark.podman

# This module's own driver name: its specs in /var/run/cdi cannot clash with another test's.
DRIVER = "gpu.podman-extended.dra-driver.dev"
HARDWARE = "mixed"
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


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[AgentProcess, client.ResourceV1Api]]:
    podman_tier.require_podman()
    with podman_tier.simulated_node(DRIVER, HARDWARE, NODE_CONFIG) as node:
        yield node


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"])
def test_a_device_plugin_pod_sees_the_device_of_its_extended_resource_claim(
    resource: str, node: tuple[AgentProcess, client.ResourceV1Api]
) -> None:
    agent, claims_api = node
    pod = gpu_pod("legacy", {resource: 1})
    device = chosen_device(resource)
    name, uid = create_and_allocate(
        claims_api,
        extended_resource_claim(pod, {resource: CLASSES[resource]["metadata"]["name"]}),
        pod,
        {"container-0-request-0": [device]},
        DRIVER,
        NODE_NAME,
    )
    claim = ClaimArg("default", name, uid)
    socket = agent.dirs.dra_socket
    answer = asyncio.run(kubelet_client.prepare(socket, "v1", [claim]))["claims"][uid]
    try:
        assert answer["error"] == ""
        (prepared,) = answer["devices"]
        assert (prepared["request_names"], prepared["device_name"]) == (["container-0-request-0"], device)
        seen = podman.run_with_cdi_devices(prepared["cdi_device_ids"], "env | grep ^DRA_ | sort").splitlines()
    finally:
        unprepared = asyncio.run(kubelet_client.unprepare(socket, "v1", [claim]))["claims"][uid]

    assert unprepared["error"] == ""
    prefix = "DRA_DEVICE_" + device.upper().replace("-", "_")
    if resource == "nvidia.com/gpu":
        assert device == "gpu-4"
        assert seen == [f"{prefix}={GPUS[4].uuid}", f"{prefix}_PRODUCT_NAME={GPUS[4].product_name}"]
    else:
        identity = {entry.partition("=")[0]: entry.partition("=")[2] for entry in seen}
        assert identity[prefix].startswith("MIG-")
        assert identity[f"{prefix}_PROFILE"] == "1g.10gb"
        assert identity[f"{prefix}_PARENT"] in {gpu.uuid for gpu in GPUS}
