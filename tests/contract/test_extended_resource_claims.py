"""A pod written for the NVIDIA device plugin, on DRA: the claim the scheduler writes for its
`nvidia.com/gpu` / `nvidia.com/mig-<profile>` limits (tests/support/extended_claims.py) goes
through the stand-in API server and the official client, and the claim engine prepares it as
kubelet would have it prepared: devices for the scheduler's request names, CDI specs with the
device's environment."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.calls import RawClaim
from dra_driver.claims.edits.gpu_edits import device_env_prefix
from dra_driver.claims.engine import PrepareOutcome
from dra_driver.claims.source import ApiServerClaimSource
from dra_driver.devices.classes import device_classes
from dra_driver.devices.extended_resources import ExtendedResources
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import device_to_api
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.server_access import ServerAccess
from tests.support.apiserver import ApiServer
from tests.support.cel import selects
from tests.support.engines import PLAIN, POOL, simulated_engine, simulated_hardware
from tests.support.extended_claims import (
    ANNOTATION,
    RequestMapping,
    create_and_allocate,
    extended_resource_claim,
    gpu_pod,
)
from tests.support.nodes import simulated_node

D = DEFAULT_DRIVER_NAME
CLASSES = {
    device_class["spec"]["extendedResourceName"]: device_class
    for device_class in device_classes(D, ExtendedResources(("1g.10gb", "3g.40gb")))
    if "extendedResourceName" in device_class["spec"]
}
CLASS_OF = {resource: device_class["metadata"]["name"] for resource, device_class in CLASSES.items()}
DYNAMIC_MIG = NodeConfig(default=GpuSettings(mode="mig-dynamic"))


# --- The claim's shape ----------------------------------------------------------------------------


def test_a_device_plugin_pod_gets_one_request_per_container_and_resource() -> None:
    pod = gpu_pod("trainer", {"nvidia.com/gpu": 2})

    claim = extended_resource_claim(pod, {"nvidia.com/gpu": "gpu.dra-driver.dev"})

    assert claim.body["metadata"] == {
        "generateName": "trainer-extended-resources-",
        "namespace": "default",
        "annotations": {ANNOTATION: "true"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "trainer",
                "uid": pod["metadata"]["uid"],
                "controller": True,
            }
        ],
    }
    assert claim.body["spec"] == {
        "devices": {
            "requests": [
                {
                    "name": "container-0-request-0",
                    "exactly": {
                        "deviceClassName": "gpu.dra-driver.dev",
                        "allocationMode": "ExactCount",
                        "count": 2,
                    },
                }
            ]
        }
    }
    assert claim.mappings == (RequestMapping("main", "nvidia.com/gpu", "container-0-request-0"),)
    for version in ("1.36.0", "1.37.0"):
        kubernetes_validate.validate(claim.body, version, strict=True)


def test_request_names_count_every_resource_of_the_container_in_sorted_order() -> None:
    """cpu and memory sort before nvidia.com/...: the MIG request is the container's third."""
    pod = gpu_pod("infer", {"nvidia.com/mig-1g.10gb": 1}, containers=2)
    pod["spec"]["containers"][1]["resources"]["requests"] = {"cpu": "1", "memory": "1Gi"}

    claim = extended_resource_claim(pod, {"nvidia.com/mig-1g.10gb": CLASS_OF["nvidia.com/mig-1g.10gb"]})

    assert [request["name"] for request in claim.body["spec"]["devices"]["requests"]] == [
        "container-0-request-0",
        "container-1-request-2",
    ]


def test_an_init_container_reuses_the_devices_of_the_containers_after_it() -> None:
    """A plain init container runs before the others, so its devices can be theirs; a sidecar
    runs beside them and needs its own."""
    pod = gpu_pod("staged", {"nvidia.com/gpu": 1})
    init = {"name": "fetch", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    sidecar = {
        "name": "side",
        "image": "x",
        "restartPolicy": "Always",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    pod["spec"]["initContainers"] = [init, sidecar]

    claim = extended_resource_claim(pod, {"nvidia.com/gpu": "gpu.dra-driver.dev"})

    requests = {
        request["name"]: request["exactly"]["count"] for request in claim.body["spec"]["devices"]["requests"]
    }
    # The init container needs 2: the sidecar's 1 and the main container's 1 cover it.
    assert requests == {"container-1-request-0": 1, "container-2-request-0": 1}
    assert set(claim.mappings) == {
        RequestMapping("fetch", "nvidia.com/gpu", "container-1-request-0"),
        RequestMapping("fetch", "nvidia.com/gpu", "container-2-request-0"),
        RequestMapping("side", "nvidia.com/gpu", "container-1-request-0"),
        RequestMapping("main", "nvidia.com/gpu", "container-2-request-0"),
    }


# --- Prepared by the engine -----------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ApiServer]:
    api = ApiServer().start()
    yield api
    api.stop()


@pytest.fixture
def claims_api(server: ApiServer) -> Iterator[client.ResourceV1Api]:
    api_client = client.ApiClient(client.Configuration(host=server.url))
    yield client.ResourceV1Api(api_client)
    api_client.close()


def allocator_choice(profile: str, config: NodeConfig, resource: str, count: int) -> list[str]:
    """The first `count` devices of the node that the resource's class selects by its CEL, as
    the scheduler's allocator evaluates it on the published devices."""
    (selector,) = CLASSES[resource]["spec"]["selectors"]
    chosen = [
        device.name
        for device in node_inventory(simulated_node(profile), config).devices
        if selects(selector["cel"]["expression"], D, device_to_api(device))
    ]
    assert len(chosen) >= count, resource
    return chosen[:count]


async def prepare_through_api(
    server: ApiServer, tmp_path: Path, profile: str, config: NodeConfig, uid: str, name: str
) -> PrepareOutcome:
    async def run() -> PrepareOutcome:
        kube = KubeClient(ServerAccess(server.url))
        try:
            engine = simulated_engine(
                tmp_path,
                ApiServerClaimSource(kube),
                profile,
                config,
                hardware=simulated_hardware(tmp_path, profile),
            )
            outcomes = await engine.prepare([RawClaim("default", name, uid)])
            return outcomes[uid]
        finally:
            await kube.close()

    return await run()


def spec_env(tmp_path: Path, uid: str) -> list[str]:
    (spec,) = (tmp_path / "cdi").glob(f"*{uid}*")
    devices: list[dict[str, Any]] = json.loads(spec.read_text())["devices"]
    return [env for device in devices for env in device["containerEdits"].get("env", [])]


@pytest.mark.parametrize(
    ("profile", "config", "resource", "count"),
    [
        ("t4x4", PLAIN, "nvidia.com/gpu", 2),
        ("dgx-h100-mig", DYNAMIC_MIG, "nvidia.com/mig-1g.10gb", 1),
        ("dgx-h100-mig", DYNAMIC_MIG, "nvidia.com/mig-3g.40gb", 2),
    ],
    ids=["whole-gpus", "mig-1g.10gb", "mig-3g.40gb"],
)
async def test_the_engine_prepares_the_scheduler_claim_for_the_request_kubelet_maps(
    profile: str,
    config: NodeConfig,
    resource: str,
    count: int,
    server: ApiServer,
    claims_api: client.ResourceV1Api,
    tmp_path: Path,
) -> None:
    pod = gpu_pod("legacy", {resource: count})
    claim = extended_resource_claim(pod, {resource: CLASS_OF[resource]})
    devices = allocator_choice(profile, config, resource, count)
    name, uid = create_and_allocate(claims_api, claim, pod, {"container-0-request-0": devices}, D, POOL)

    outcome = await prepare_through_api(server, tmp_path, profile, config, uid, name)

    assert name.startswith("legacy-extended-resources-")
    assert outcome.error == ""
    assert [(d.request_names, d.device) for d in outcome.devices] == [
        (("container-0-request-0",), d) for d in devices
    ]
    env = spec_env(tmp_path, uid)
    for device in devices:
        prefix = device_env_prefix(device)
        (identity,) = [entry for entry in env if entry.startswith(f"{prefix}=")]
        assert identity.removeprefix(f"{prefix}=").startswith("MIG-" if "mig" in resource else "GPU-")
    if "mig" in resource:
        profile_name = resource.removeprefix("nvidia.com/mig-")
        assert sum(entry.endswith(f"_PROFILE={profile_name}") for entry in env) == count
