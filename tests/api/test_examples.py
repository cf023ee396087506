"""The user examples in deploy/examples, checked without a cluster.

Each example is a ResourceClaimTemplate and a pod. Here: every object is valid for Kubernetes
1.34 to 1.37 by the upstream schemas (strict), every DeviceClass it names is shipped, every
request (and every firstAvailable alternative) can be allocated on the node the kind e2e tests
run (hack/e2e-node), with the DeviceClass's and the request's CEL selectors evaluated by the real
CEL engine, the opaque configs decode, and each pod prints what the e2e tests read. What the e2e
tests expect in the containers (tests/support/examples.py) is checked against what the claim
engine renders from these requests. The installation hack/kind-up.sh makes is schema-checked too.
"""

import json
import os
import re
import uuid
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.claims.calls import RawClaim
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.edits.gpu_edits import device_env_prefix
from dra_driver.claims.edits.vgpu_edits import vgpu_claim_edits
from dra_driver.claims.engine import SharingControls
from dra_driver.claims.opaque_config import (
    GpuConfig,
    MigDeviceConfig,
    Sharing,
    TimeSlicingSettings,
    VgpuConfig,
    decode_parameters,
)
from dra_driver.claims.sharing.mps import SimulatedMps
from dra_driver.claims.vgpu_grant import vgpu_grant
from dra_driver.cli import main
from dra_driver.devices.attributes import STANDARD_NUMA_NODE, STANDARD_PCIE_ROOT
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import Device, device_to_api
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from dra_driver.tools.manifests import ManifestOptions, render
from tests.e2e import mock_driver
from tests.e2e.deploy import NODE_LABEL, e2e_manifest_args, e2e_manifests
from tests.support.cel import CelEvaluationError, parse_quantity, selects
from tests.support.engines import simulated_engine, simulated_hardware
from tests.support.examples import (
    CEL_MIN_MEMORY,
    CEL_PRODUCT_PREFIX,
    CLAIM_MPS_MEMORY,
    CLAIM_MPS_THREADS,
    DEV_MARKER,
    E2E_HARDWARE_FILE,
    E2E_NODE_CONFIG_FILE,
    ENV_MARKER,
    EXAMPLES_DIR,
    MIG_PROFILE,
    MIG_STATIC_PROFILE,
    PARTITION_MPS_MEMORY,
    PARTITION_MPS_THREADS,
    REPOSITORY,
    VGPU_MEMORY_LIMIT,
    VGPU_MPS_MEMORY,
    VGPU_MPS_THREADS,
    VGPU_SM_LIMIT,
    D,
    candidates,
    consumed_capacity,
    device_classes,
    documents,
    e2e_node_gpus,
    e2e_node_inventory,
    example_path,
    example_paths,
    mig_profiles,
    only,
    parse_report,
    pod_of,
    requests_of,
    run_locally,
    whole_gpu_uuids,
)
from tests.support.k8s_schemas import validate_everywhere
from tests.support.nodes import all_profiles, mode_configs, simulated_node

EXAMPLES = {
    "gpu-whole",
    "mig-1g10gb",
    "mig-static-3g40gb",
    "vgpu-10gi-30pct",
    "vgpu-partition-6gi",
    "mps-shared",
    "time-slicing-shared",
    "cel-selection",
    "first-available-fallback",
    "admin-monitoring",
    "gpus-one-pcie-root",
    "gpus-one-numa-node",
    "gpu-shared-by-pods",
}
PATHS = example_paths()
SHARE_ID = "4d2b8a52-1c1e-4c4c-9a55-0d1d6c1b8a01"
CLAIM_UID = "0f8e2a4c-6b1d-4e3f-9a7c-2d5b8e1f3a60"


def template_of(path: Path) -> dict[str, Any]:
    """The example's claim template; for an example whose pods share one ResourceClaim, that
    claim's spec in a template's shape (what its requests are read from)."""
    objects = documents(path)
    if any(item["kind"] == "ResourceClaim" for item in objects):
        claim = only(objects, "ResourceClaim")
        return {
            "kind": "ResourceClaimTemplate",
            "metadata": claim["metadata"],
            "spec": {"spec": claim["spec"]},
        }
    return only(objects, "ResourceClaimTemplate")


def pods_of(path: Path) -> list[dict[str, Any]]:
    return [item for item in documents(path) if item["kind"] == "Pod"]


def the_request(name: str) -> dict[str, Any]:
    ((_, request),) = requests_of(template_of(example_path(name)))
    return request


def names(devices: list[Device]) -> set[str]:
    return {device.name for device in devices}


@cache
def every_inventory_device() -> tuple[Device, ...]:
    """Every device of every simulated profile offered every way, and of the e2e node."""
    produced: dict[str, Device] = {}
    for profile in all_profiles():
        gpus = simulated_node(profile)
        for mode, config in mode_configs(gpus).items():
            for device in node_inventory(gpus, config).devices:
                produced[f"{profile}/{mode}/{device.name}"] = device
    for device in e2e_node_inventory().devices:
        produced[f"e2e/{device.name}"] = device
    return tuple(produced.values())


# --- The files --------------------------------------------------------------------------------


def test_the_examples_are_the_documented_ones() -> None:
    readme = (EXAMPLES_DIR / "README.md").read_text()

    assert {path.stem for path in PATHS} == EXAMPLES
    for path in PATHS:
        assert f"[`{path.name}`]({path.name})" in readme, (
            f"deploy/examples/README.md does not list {path.name}"
        )


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.stem)
def test_every_object_is_valid_for_every_supported_kubernetes(path: Path) -> None:
    validate_everywhere(documents(path))


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.stem)
def test_each_example_is_a_claim_template_and_a_pod_that_uses_it(path: Path) -> None:
    """Or one ResourceClaim and the pods that share it, each naming it by resourceClaimName."""
    objects = documents(path)
    template, pods = template_of(path), pods_of(path)
    namespaces = [item["metadata"]["name"] for item in objects if item["kind"] == "Namespace"]
    shared = any(item["kind"] == "ResourceClaim" for item in objects)

    kinds = sorted(item["kind"] for item in objects if item["kind"] != "Namespace")
    assert kinds == (["Pod", "Pod", "ResourceClaim"] if shared else ["Pod", "ResourceClaimTemplate"])
    # Without a namespace of its own, an example goes wherever `kubectl apply -n` puts it.
    expected_namespace = namespaces[0] if namespaces else None
    assert len(namespaces) <= 1
    for item in (template, *pods):
        assert item["metadata"].get("namespace") == expected_namespace
    source = "resourceClaimName" if shared else "resourceClaimTemplateName"
    for pod in pods:
        spec = pod["spec"]
        assert spec["resourceClaims"] == [
            {"name": claim["name"], source: template["metadata"]["name"]} for claim in spec["resourceClaims"]
        ]
        claim_names = {claim["name"] for claim in spec["resourceClaims"]}
        for container in spec["containers"]:
            assert {claim["name"] for claim in container["resources"]["claims"]} == claim_names
        # The pod runs once and ends, so the e2e tests can wait for it and read its logs.
        assert spec["restartPolicy"] == "Never"


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.stem)
def test_each_pod_prints_the_report_the_e2e_tests_read(path: Path) -> None:
    """The containers' command, run by this machine's sh, prints a report that parses back."""
    for container in (container for pod in pods_of(path) for container in pod["spec"]["containers"]):
        output = run_locally(container, {"PATH": os.environ["PATH"], "DRA_DEVICE_GPU_0": "GPU-1234"})
        report = parse_report(output)
        assert report.env["DRA_DEVICE_GPU_0"] == "GPU-1234"
        assert "null" in report.dev


def test_a_report_is_read_as_env_and_dev() -> None:
    output = "\n".join([ENV_MARKER, "A=1", "B=x=y", "DRA_DEVICE_GPU_3=GPU-9", DEV_MARKER, "null", "nvidia0"])
    report = parse_report(output)

    assert report.env == {"A": "1", "B": "x=y", "DRA_DEVICE_GPU_3": "GPU-9"}
    assert report.dev == {"null", "nvidia0"}
    assert whole_gpu_uuids(report.env) == {"DRA_DEVICE_GPU_3": "GPU-9"}
    assert mig_profiles({"DRA_DEVICE_GPU_4_MIG_1G10GB_0_PROFILE": "1g.10gb", "X_PROFILE": "y"}) == {
        "DRA_DEVICE_GPU_4_MIG_1G10GB_0_PROFILE": "1g.10gb"
    }
    with pytest.raises(ValueError, match="== env"):
        parse_report("A=1\n")


# --- Devices ------------------------------------------------------------------------------------


def test_every_device_class_an_example_names_is_shipped_and_every_one_is_shown() -> None:
    used = {request["deviceClassName"] for path in PATHS for _, request in requests_of(template_of(path))}

    assert used == set(device_classes())


def test_the_e2e_node_offers_every_kind_of_device() -> None:
    devices = e2e_node_inventory().devices

    assert {device.type for device in devices} == {"gpu", "mig", "vgpu"}
    assert any(device.allow_multiple_allocations for device in devices)
    assert any(device.consumes_counters for device in devices)


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.stem)
def test_every_request_can_be_allocated_on_the_e2e_node(path: Path) -> None:
    for name, request in requests_of(template_of(path)):
        found = candidates(request, e2e_node_inventory().devices)
        assert len(found) >= request.get("count", 1), f"{path.name}: request {name} matches no device"


def test_every_cel_selector_evaluates_without_error_on_every_device_of_its_class() -> None:
    """A selector that fails on a device fails the scheduling attempt, so it must evaluate on
    every device its DeviceClass lets through, on every simulated node and in every mode."""
    classes = device_classes()
    checked = 0
    for path in PATHS:
        for name, request in requests_of(template_of(path)):
            (class_selector,) = classes[request["deviceClassName"]]["spec"]["selectors"]
            for selector in request.get("selectors", []):
                for device in every_inventory_device():
                    rendered = device_to_api(device)
                    if not selects(class_selector["cel"]["expression"], D, rendered):
                        continue
                    try:
                        selects(selector["cel"]["expression"], D, rendered)
                    except CelEvaluationError as error:
                        pytest.fail(f"{path.name}, request {name}: {error}")
                    checked += 1
    assert checked > 1000


def test_the_cel_example_picks_exactly_the_whole_h100s_with_at_least_40gi() -> None:
    request = the_request("cel-selection")
    expression = request["selectors"][0]["cel"]["expression"]
    minimum = parse_quantity(CEL_MIN_MEMORY)

    def wanted(device: Device) -> bool:
        return (
            device.type == "gpu"
            and str(device.attributes["productName"]).startswith(CEL_PRODUCT_PREFIX)
            and device.capacity["memory"].value >= minimum
        )

    assert f'"{CEL_PRODUCT_PREFIX}"' in expression
    assert f'quantity("{CEL_MIN_MEMORY}")' in expression
    assert names(candidates(request, e2e_node_inventory().devices)) == {"gpu-0", "gpu-1", "gpu-2", "gpu-4"}
    everything = every_inventory_device()
    chosen = candidates(request, everything)
    assert chosen == [device for device in everything if wanted(device)]
    assert any(device.type == "gpu" and not wanted(device) for device in everything)
    # No simulated H100 has less than 40Gi whole, so the memory bound is checked on a copy.
    h100 = device_to_api(chosen[0])
    smaller = {**h100, "capacity": {**h100["capacity"], "memory": {"value": "39Gi"}}}
    assert selects(expression, D, h100)
    assert not selects(expression, D, smaller)


@pytest.mark.parametrize(
    ("name", "request_name"),
    [("mig-1g10gb", "mig"), ("first-available-fallback", "accelerator/mig")],
)
def test_the_mig_requests_get_exactly_the_1g10gb_devices(name: str, request_name: str) -> None:
    request = dict(requests_of(template_of(example_path(name))))[request_name]
    devices = e2e_node_inventory().devices
    found = candidates(request, devices)

    assert found
    assert names(found) == {
        device.name
        for device in devices
        if device.type == "mig" and device.attributes["profile"] == MIG_PROFILE
    }
    assert all(re.fullmatch(r"gpu-[56]-mig-1g10gb-[0-6]", device.name) for device in found)


@pytest.mark.parametrize(
    ("name", "request_name"),
    [("vgpu-10gi-30pct", "vgpu"), ("first-available-fallback", "accelerator/vgpu")],
)
def test_the_vgpu_requests_get_the_limits_the_e2e_tests_expect(name: str, request_name: str) -> None:
    """10Gi and 30 % of the shareable GPU, which the claim engine turns into the HAMi-core limits.
    The L4's 12Gi / 50 % partition has room for the request too (a device that is not shared
    must have at least the capacity asked for), but the shareable GPU is published first, and
    the scheduler takes the first device that fits."""
    request = dict(requests_of(template_of(example_path(name))))[request_name]
    inventory = e2e_node_inventory()
    device, *larger = candidates(request, inventory.devices)
    assert [other.name for other in larger] == ["gpu-8-vgpu-12gi-0"]
    consumed = consumed_capacity(request, device_to_api(device))
    result = {"request": request_name, "driver": "gpu.example.com", "pool": "node-a", "device": device.name}
    document = {
        "metadata": {"uid": CLAIM_UID},
        "status": {
            "allocation": {
                "devices": {"results": [{**result, "consumedCapacity": consumed, "shareID": SHARE_ID}]}
            }
        },
    }
    (allocated,) = ResourceClaimView.decode(document, "gpu.example.com").results
    share = vgpu_grant(allocated, device, inventory.gpu_of_device[device.name], VgpuConfig(), "none")
    env = dict(item.split("=", 1) for item in vgpu_claim_edits(CLAIM_UID, [share], None, None).edits.env)

    assert device.name == "gpu-3"
    assert consumed == {"memory": "10Gi", "cores": "30", "clients": "1"}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == VGPU_MEMORY_LIMIT
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == VGPU_SM_LIMIT


def test_a_capacity_request_that_does_not_fit_gets_no_device() -> None:
    request = the_request("vgpu-10gi-30pct")
    devices = e2e_node_inventory().devices
    too_much_memory = {**request, "capacity": {"requests": {"memory": "81560Mi", "cores": "30"}}}
    too_many_cores = {**request, "capacity": {"requests": {"memory": "10Gi", "cores": "101"}}}
    unknown_capacity = {**request, "capacity": {"requests": {"bandwidth": "1"}}}

    assert names(candidates(request, devices)) == {"gpu-3", "gpu-8-vgpu-12gi-0"}
    assert candidates(too_much_memory, devices) == []
    assert candidates(too_many_cores, devices) == []
    assert candidates(unknown_capacity, devices) == []
    # Rounded up to the step of the request policy, as the scheduler does.
    gpu = device_to_api(next(device for device in devices if device.name == "gpu-3"))
    assert consumed_capacity({"capacity": {"requests": {"memory": "1500Ki"}}}, gpu) == {
        "memory": "2Mi",
        "cores": "100",
        "clients": "1",
    }
    # At most the GPU's 48 MPS clients; a partition has no clients capacity to ask for.
    too_many_clients = {
        **request,
        "capacity": {"requests": {"memory": "10Gi", "cores": "30", "clients": "49"}},
    }
    assert candidates(too_many_clients, devices) == []


def test_the_fallback_tries_a_mig_slice_first_then_the_vgpu_share() -> None:
    (request,) = template_of(example_path("first-available-fallback"))["spec"]["spec"]["devices"]["requests"]

    assert [(sub["name"], sub["deviceClassName"]) for sub in request["firstAvailable"]] == [
        ("mig", "mig.dra-driver.dev"),
        ("vgpu", "vgpu.dra-driver.dev"),
    ]
    assert request["firstAvailable"][1]["capacity"] == the_request("vgpu-10gi-30pct")["capacity"]


# --- Configs and sharing ------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.stem)
def test_every_opaque_config_decodes_and_fits_the_devices_it_applies_to(path: Path) -> None:
    template = template_of(path)
    requests = dict(requests_of(template))
    fitting = {"gpu": GpuConfig, "mig": MigDeviceConfig, "vgpu": VgpuConfig}
    for entry in template["spec"]["spec"]["devices"].get("config", []):
        assert entry["opaque"]["driver"] == D
        config = decode_parameters(entry["opaque"]["parameters"])
        applies_to = [
            request
            for name, request in requests.items()
            if not entry.get("requests")
            or name in entry["requests"]
            or name.split("/")[0] in entry["requests"]
        ]
        assert applies_to
        for request in applies_to:
            for device in candidates(request, e2e_node_inventory().devices):
                assert isinstance(config, fitting[device.type]), f"{path.name}: {device.name}"


def test_the_time_slicing_example_shares_one_claim_between_two_containers() -> None:
    path = example_path("time-slicing-shared")
    (entry,) = template_of(path)["spec"]["spec"]["devices"]["config"]
    containers = pod_of(path)["spec"]["containers"]

    assert decode_parameters(entry["opaque"]["parameters"]) == GpuConfig(
        Sharing("TimeSlicing", TimeSlicingSettings("Long"), None)
    )
    assert len(containers) == 2
    assert containers[0]["resources"]["claims"] == containers[1]["resources"]["claims"]
    assert len(pod_of(path)["spec"]["resourceClaims"]) == 1


def test_the_admin_example_runs_in_a_namespace_that_allows_admin_access() -> None:
    path = example_path("admin-monitoring")
    namespace = only(documents(path), "Namespace")
    request = the_request("admin-monitoring")

    assert namespace["metadata"]["labels"]["resource.kubernetes.io/admin-access"] == "true"
    assert request["adminAccess"] is True
    assert request["allocationMode"] == "All"
    devices = e2e_node_inventory().devices
    assert names(candidates(request, devices)) == {device.name for device in devices if device.type == "gpu"}


# --- The e2e installation ---------------------------------------------------------------------


def test_the_e2e_installation_is_valid_for_every_supported_kubernetes() -> None:
    validate_everywhere(e2e_manifests("dra-driver:e2e-0123456789ab"))


def test_the_e2e_installation_is_the_default_one_on_the_mock_driver() -> None:
    """The agent runs the real NVML backend on the mock driver tests/e2e/mock_driver.py lays out
    on the worker: the driver root there, the mock's environment, the e2e node config."""
    image = "dra-driver:e2e-0123456789ab"
    objects = e2e_manifests(image)
    # The MPS daemon pods' admission policy names the driver root: the default is rendered on that root.
    default = render(
        ManifestOptions(image=image, node_selector=dict([NODE_LABEL]), driver_root=mock_driver.DRIVER_ROOT)
    )
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}

    assert [item for item in objects if item["kind"] not in ("ConfigMap", "DaemonSet")] == [
        item for item in default if item["kind"] != "DaemonSet"
    ]
    assert pod["nodeSelector"] == dict([NODE_LABEL])
    config_maps = [item["data"] for item in objects if item["kind"] == "ConfigMap"]
    assert [text for data in config_maps for text in data.values()] == [E2E_NODE_CONFIG_FILE.read_text()]
    assert env["DRA_DRIVER_HARDWARE"] == "nvml" and env["DRA_DRIVER_NODE_CONFIGS"]
    assert (
        volumes["driver-root"]["hostPath"]["path"] == env["DRA_DRIVER_HOST_ROOT"] == mock_driver.DRIVER_ROOT
    )
    assert {name: env[name] for name in mock_driver.mock_environment()} == mock_driver.mock_environment()
    # The mock's files are in the agent's run directory, mounted read-write at its own path.
    run = volumes["run"]["hostPath"]["path"]
    assert all(path.startswith(f"{run}/") for path in mock_driver.mock_environment().values())


def test_kind_up_installs_the_e2e_chart_values(capsys: pytest.CaptureFixture[str]) -> None:
    """kind-up.sh installs the chart with the values of tests/e2e/deploy.py (whose installation
    tests/api/test_helm_chart.py compares with e2e_manifests); `dra-driver manifests` with
    e2e_manifest_args renders the same objects for an install without Helm."""
    script = (REPOSITORY / "hack" / "kind-up.sh").read_text()
    assert '-m tests.e2e.deploy values --image "$image"' in script
    assert '-m tests.e2e.deploy install --image "$image"' in script
    assert '"$repo_root/deploy/helm/dra-driver"' in script
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPOSITORY)
        assert main(["manifests", *e2e_manifest_args("dra-driver:e2e-0123456789ab")]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == e2e_manifests("dra-driver:e2e-0123456789ab")


# --- The claim engine on the e2e node -----------------------------------------------------------

NODE = "node-a"


class ExampleClaims:
    """The claim source of the engine: each example's claim, allocated as the scheduler would
    (the first alternative that has devices, the first devices of it, capacity consumed by the
    request policy, a shareID on a shared device) with the template's configs."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def allocate(self, name: str, template: dict[str, Any], devices: tuple[Device, ...]) -> RawClaim:
        results = []
        for request in template["spec"]["spec"]["devices"]["requests"]:
            alternatives = (
                [(request["name"], request["exactly"])]
                if "exactly" in request
                else [(f"{request['name']}/{sub['name']}", sub) for sub in request["firstAvailable"]]
            )
            request_name, chosen = next(
                (alternative, found)
                for alternative, wanted in alternatives
                if (found := candidates(wanted, devices))
            )
            wanted = dict(alternatives)[request_name]
            if wanted.get("allocationMode") != "All":
                count = wanted.get("count", 1)
                chosen = _matching(chosen, _matched_attributes(template, request["name"]), count)[:count]
            for device in chosen:
                result: dict[str, Any] = {
                    "request": request_name,
                    "driver": D,
                    "pool": NODE,
                    "device": device.name,
                }
                if wanted.get("adminAccess"):
                    result["adminAccess"] = True
                if device.allow_multiple_allocations:
                    result["shareID"] = str(uuid.uuid4())
                    result["consumedCapacity"] = consumed_capacity(wanted, device_to_api(device))
                results.append(result)
        # As the scheduler writes them: the classes' configs first, for the requests of each class.
        classes = device_classes()
        configs = [
            {"source": "FromClass", "requests": [name], "opaque": entry["opaque"]}
            for name, wanted in requests_of(template)
            for entry in classes[wanted["deviceClassName"]]["spec"].get("config", [])
        ]
        configs += [
            {"source": "FromClaim", "requests": entry.get("requests", []), "opaque": entry["opaque"]}
            for entry in template["spec"]["spec"]["devices"].get("config", [])
        ]
        claim_uid = str(uuid.uuid4())
        self.claims[("default", name)] = {
            "metadata": {"namespace": "default", "name": name, "uid": claim_uid},
            "status": {"allocation": {"devices": {"results": results, "config": configs}}},
        }
        return RawClaim("default", name, claim_uid)

    async def get(self, namespace: str, name: str) -> object:
        return self.claims[(namespace, name)]


def _matched_attributes(template: dict[str, Any], request: str) -> list[str]:
    """The attributes a claim's matchAttribute constraints make its request's devices share, by
    the name the inventory keys them with (ours unqualified, the standard ones qualified)."""
    return [
        constraint["matchAttribute"].removeprefix(f"{D}/")
        for constraint in template["spec"]["spec"]["devices"].get("constraints", [])
        if "matchAttribute" in constraint and request in constraint.get("requests", [request])
    ]


def _matching(devices: list[Device], attributes: list[str], count: int) -> list[Device]:
    """The first `count` devices, in order, that share every attribute (the scheduler's
    matchAttribute); none when no value has enough."""
    if not attributes:
        return devices
    groups: dict[tuple[Any, ...], list[Device]] = {}
    for device in devices:
        if all(attribute in device.attributes for attribute in attributes):
            key = tuple(device.attributes[attribute] for attribute in attributes)
            groups.setdefault(key, []).append(device)
    return next((group for group in groups.values() if len(group) >= count), [])


def _same(attribute: str) -> Callable[[dict[str, str], list[dict[str, Any]]], None]:
    def check(env: dict[str, str], results: list[dict[str, Any]]) -> None:
        _whole(env, results)
        devices = {device.name: device for device in e2e_node_inventory(NODE).devices}
        values = {devices[result["device"]].attributes[attribute] for result in results}
        assert len(values) == 1, (attribute, values)

    return check


def _whole(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    inventory = e2e_node_inventory(NODE)
    devices = [result["device"] for result in results]
    assert whole_gpu_uuids(env) == {
        device_env_prefix(device): inventory.gpu_of_device[device].uuid for device in devices
    }


def _mig(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    (result,) = results
    assert mig_profiles(env) == {f"{device_env_prefix(result['device'])}_PROFILE": MIG_PROFILE}


def _vgpu(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    """The e2e node's vGPUs are under the default vgpu.enforcement, mps."""
    _whole(env, results)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == VGPU_MPS_THREADS
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == VGPU_MPS_MEMORY
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"


def _mig_static(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    """The instance GPU 9 has from boot, by its MIG UUID."""
    (result,) = results
    (device,) = [device for device in e2e_node_inventory(NODE).devices if device.name == result["device"]]
    prefix = device_env_prefix(result["device"])
    assert mig_profiles(env) == {f"{prefix}_PROFILE": MIG_STATIC_PROFILE}
    assert env[prefix] == device.attributes["uuid"]


def _partition(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    (result,) = results
    assert result["device"].startswith("gpu-8-vgpu-6gi-")
    gpu = e2e_node_inventory(NODE).gpu_of_device[result["device"]]
    assert env[device_env_prefix(result["device"])] == gpu.uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == PARTITION_MPS_THREADS
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == PARTITION_MPS_MEMORY


def _claim_mps(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    _whole(env, results)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == CLAIM_MPS_THREADS
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == CLAIM_MPS_MEMORY
    assert env["CUDA_MPS_PIPE_DIRECTORY"]


def _cel(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    _whole(env, results)
    (result,) = results
    assert env[f"{device_env_prefix(result['device'])}_PRODUCT_NAME"].startswith(CEL_PRODUCT_PREFIX)


def _admin(env: dict[str, str], results: list[dict[str, Any]]) -> None:
    _whole(env, results)
    assert {result["device"] for result in results} == {
        device.name for device in e2e_node_inventory(NODE).devices if device.type == "gpu"
    }


# What tests/e2e/test_examples_on_kind.py asserts about each example's containers.
WHAT_THE_E2E_TESTS_EXPECT: dict[str, Callable[[dict[str, str], list[dict[str, Any]]], None]] = {
    "gpu-whole": _whole,
    "mig-1g10gb": _mig,
    "mig-static-3g40gb": _mig_static,
    "vgpu-10gi-30pct": _vgpu,
    "vgpu-partition-6gi": _partition,
    "time-slicing-shared": _whole,
    "mps-shared": _claim_mps,
    "cel-selection": _cel,
    "first-available-fallback": _mig,  # MIG is the first alternative, and free here
    "admin-monitoring": _admin,
    "gpus-one-pcie-root": _same(STANDARD_PCIE_ROOT),
    "gpus-one-numa-node": _same(STANDARD_NUMA_NODE),
    "gpu-shared-by-pods": _whole,
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
async def test_the_engine_on_the_e2e_node_gives_each_example_what_the_e2e_tests_expect(
    name: str, short_dir: Path
) -> None:
    """The real claim engine prepares the example's claim on the e2e node's simulated GPUs; the
    environment its CDI spec gives the containers passes the e2e tests' checks."""
    inventory = e2e_node_inventory(NODE)
    claims = ExampleClaims()
    raw = claims.allocate(name, template_of(example_path(name)), inventory.devices)
    time_slicer = SimulatedTimeSlicer(gpu.uuid for gpu in e2e_node_gpus(NODE))
    engine = simulated_engine(
        short_dir,
        claims,
        pool=NODE,
        inventory=inventory,
        hardware=simulated_hardware(short_dir, str(E2E_HARDWARE_FILE), NODE),
        sharing=SharingControls(time_slicer, SimulatedMps(short_dir / "mps")),
    )

    async def prepare() -> str:
        await engine.load_state()
        return (await engine.prepare([raw]))[raw[2]].error

    assert await prepare() == ""
    try:
        (spec,) = (short_dir / "cdi").glob(f"*{raw[2]}*")
        env = dict(
            item.split("=", 1)
            for device in json.loads(spec.read_text())["devices"]
            for item in device["containerEdits"].get("env", [])
        )
        results = claims.claims[("default", name)]["status"]["allocation"]["devices"]["results"]
        WHAT_THE_E2E_TESTS_EXPECT[name](env, results)
        if name in ("time-slicing-shared", "gpu-shared-by-pods"):
            (result,) = results
            interval = await time_slicer.current(inventory.gpu_of_device[result["device"]].uuid)
            assert interval == "Long"
    finally:
        # A vGPU share's MPS daemon outlives the engine, as it outlives the agent: it stops with
        # its GPU's last share.
        assert await engine.unprepare([raw]) == {raw[2]: ""}


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES_DIR / "node-configs").glob("*.yaml")), ids=lambda path: path.stem
)
def test_each_node_config_example_is_valid_on_the_hardware_its_header_names(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `Check it:` line of the file's header, run: the config fits that node whole."""
    (hardware,) = re.findall(r"Check it: dra-driver validate-config \S+ --hardware (\S+)", path.read_text())

    assert main(["validate-config", str(path), "--hardware", hardware]) == 0, capsys.readouterr().err
    assert "valid" in capsys.readouterr().out
