"""The examples in deploy/examples on a kind cluster (hack/e2e.sh): the node agent's NVML backend
on the mock driver (tests/e2e/mock_driver.py), the real scheduler, kubelet and containerd with
CDI. Each test runs an example's pod to completion and checks what the driver put into its
containers.

Not part of `make test` (pyproject's norecursedirs leaves tests/e2e out): it needs Docker, kind
and a cluster. tests/api/test_examples.py checks the same examples without one.
"""

from typing import Any

from dra_driver.claims.edits.gpu_edits import device_env_prefix
from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.attributes import STANDARD_NUMA_NODE, STANDARD_PCIE_ROOT
from dra_driver.devices.inventory import Inventory, build_inventory
from dra_driver.devices.node_config import plan_gpus
from dra_driver.publish.capabilities import fall_back
from dra_driver.tools.manifests import DEFAULT_NAMESPACE
from tests.e2e import kube
from tests.e2e.conftest import RunCopies, RunExample, _Runner
from tests.support.cel import parse_quantity
from tests.support.examples import (
    CEL_MIN_MEMORY,
    CEL_PRODUCT_PREFIX,
    CLAIM_MPS_MEMORY,
    CLAIM_MPS_THREADS,
    E2E_NODE_CONFIG_FILE,
    MIG_PROFILE,
    MIG_STATIC_PROFILE,
    PARTITION_MPS_MEMORY,
    PARTITION_MPS_THREADS,
    VGPU_MPS_MEMORY,
    VGPU_MPS_THREADS,
    D,
    e2e_node_gpus,
    e2e_node_inventory,
    mig_profiles,
    whole_gpu_uuids,
)


def _attribute(device: dict[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def _gpu_env(node: str, *devices: str) -> dict[str, str]:
    """What a simulated node puts into a container for whole GPUs or vGPUs: the GPU's UUID in
    DRA_DEVICE_<device>."""
    inventory = e2e_node_inventory(node)
    return {device_env_prefix(device): inventory.gpu_of_device[device].uuid for device in devices}


def _expected_inventory(node: str, kubernetes_version: tuple[int, int]) -> Inventory:
    """The e2e node's devices as the agent offers them on this cluster: on 1.34 the vGPU-capacity
    GPU falls back to partitions (its scheduler misallocates consumable capacity)."""
    plans = plan_gpus(load_node_config(E2E_NODE_CONFIG_FILE), e2e_node_gpus(node))
    return build_inventory(fall_back(plans, frozenset(), kubernetes_version)[0])


def test_the_agent_publishes_the_devices_the_examples_were_checked_against(
    worker: str, kubernetes_version: tuple[int, int]
) -> None:
    published = kube.published_devices(worker)
    expected = {device.name: device for device in _expected_inventory(worker, kubernetes_version).devices}

    assert set(published) == set(expected)
    for name, device in published.items():
        assert _attribute(device, "type") == expected[name].type, name


def test_two_whole_gpu_pods_get_different_gpus(run_copies: RunCopies) -> None:
    # Created at once: a pod that has finished has given its GPU back, and the next may get it.
    runs = run_copies("gpu-whole", ("gpu-whole-first", "gpu-whole-second"))

    devices = []
    for run in runs:
        (result,) = run.results
        assert whole_gpu_uuids(run.reports["main"].env) == _gpu_env(run.node, result["device"])
        # containerd injected the nodes the CDI specs name below the driver root on the worker.
        minor = e2e_node_inventory(run.node).gpu_of_device[result["device"]].minor
        assert {f"nvidia{minor}", "nvidiactl", "nvidia-uvm"} <= run.reports["main"].dev
        devices.append((run.node, result["device"]))
    assert devices[0] != devices[1]


def test_two_containers_sharing_a_time_sliced_claim_see_the_same_gpu(run_example: RunExample) -> None:
    run = run_example("time-slicing-shared")

    (result,) = run.results
    expected = _gpu_env(run.node, result["device"])
    assert whole_gpu_uuids(run.reports["first"].env) == expected
    assert whole_gpu_uuids(run.reports["second"].env) == expected


def test_the_mig_pod_gets_a_1g10gb_instance(run_example: RunExample) -> None:
    run = run_example("mig-1g10gb")

    (result,) = run.results
    assert "-mig-1g10gb-" in result["device"]
    assert mig_profiles(run.reports["main"].env) == {
        f"{device_env_prefix(result['device'])}_PROFILE": MIG_PROFILE
    }


def test_the_static_mig_pod_gets_an_instance_made_before_the_driver_started(run_example: RunExample) -> None:
    run = run_example("mig-static-3g40gb")

    (result,) = run.results
    device = kube.published_devices(run.node)[result["device"]]
    prefix = device_env_prefix(result["device"])
    env = run.reports["main"].env
    assert mig_profiles(env) == {f"{prefix}_PROFILE": MIG_STATIC_PROFILE}
    # The instance the mock driver had at boot, by its MIG UUID; prepare made none.
    assert env[prefix] == _attribute(device, "uuid")
    assert result["device"].startswith("gpu-9-mig-3g40gb-")


def test_the_partition_pod_gets_a_6gi_partition_under_its_gpus_mps_daemon(run_example: RunExample) -> None:
    run = run_example("vgpu-partition-6gi")

    (result,) = run.results
    assert result["device"].startswith("gpu-8-vgpu-6gi-")
    env = run.reports["main"].env
    gpu = e2e_node_inventory(run.node).gpu_of_device[result["device"]]
    assert env[device_env_prefix(result["device"])] == gpu.uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == PARTITION_MPS_THREADS
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == PARTITION_MPS_MEMORY
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"


def test_two_containers_share_the_claims_own_mps_daemon_which_ran_as_a_pod(run_example: RunExample) -> None:
    run = run_example("mps-shared")

    (result,) = run.results
    expected = _gpu_env(run.node, result["device"])
    pipes = set()
    for container in ("first", "second"):
        env = run.reports[container].env
        assert whole_gpu_uuids(env) == expected
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == CLAIM_MPS_THREADS
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == CLAIM_MPS_MEMORY
        pipes.add(env["CUDA_MPS_PIPE_DIRECTORY"])
    assert len(pipes) == 1, pipes
    # The daemon ran in a pod of its own, started by kubelet before the claim was prepared.
    (claim_uid,) = run.claim_uids
    events = kube.get(
        "events", "--namespace", DEFAULT_NAMESPACE, "--field-selector", f"involvedObject.name=mps-{claim_uid}"
    )["items"]
    assert "Started" in {event["reason"] for event in events}, events


def test_the_vgpu_pod_sees_its_memory_and_sm_limits(
    run_example: RunExample, worker: str, kubernetes_version: tuple[int, int]
) -> None:
    if kubernetes_version == (1, 34):
        # No capacity share to allocate: the GPU is offered as fixed partitions instead.
        published = kube.published_devices(worker)
        assert _attribute(published["gpu-3"], "type") == "gpu"
        assert any(name.startswith("gpu-3-vgpu-") for name in published), sorted(published)
        return
    run = run_example("vgpu-10gi-30pct")

    (result,) = run.results
    env = run.reports["main"].env
    # The e2e node's vGPUs are under the default vgpu.enforcement, mps: the GPU's MPS daemon.
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == VGPU_MPS_THREADS
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == VGPU_MPS_MEMORY
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert whole_gpu_uuids(env) == _gpu_env(run.node, result["device"])
    consumed = {name: parse_quantity(value) for name, value in result["consumedCapacity"].items()}
    # Under MPS the share is one of the GPU's 48 MPS clients too, by the capacity's default.
    assert consumed == {"memory": parse_quantity("10Gi"), "cores": parse_quantity("30"), "clients": 1}
    assert result.get("shareID"), "a share of a device that allows multiple allocations has a shareID"


def test_the_cel_pod_gets_an_h100_with_at_least_40gi(run_example: RunExample) -> None:
    run = run_example("cel-selection")

    # The agent reported the device in the claim's status.devices (KEP-4817).
    ((claim_devices),) = run.device_status.values()
    (result_entry,) = run.results
    assert [(entry["driver"], entry["pool"], entry["device"]) for entry in claim_devices] == [
        (result_entry["driver"], result_entry["pool"], result_entry["device"])
    ]

    (result,) = run.results
    device = kube.published_devices(run.node)[result["device"]]
    assert _attribute(device, "productName").startswith(CEL_PRODUCT_PREFIX)
    assert parse_quantity(device["capacity"]["memory"]["value"]) >= parse_quantity(CEL_MIN_MEMORY)
    env = run.reports["main"].env
    assert whole_gpu_uuids(env) == {device_env_prefix(result["device"]): _attribute(device, "uuid")}
    assert env[f"{device_env_prefix(result['device'])}_PRODUCT_NAME"] == _attribute(device, "productName")


def test_the_fallback_pod_gets_one_of_its_two_alternatives(run_example: RunExample) -> None:
    run = run_example("first-available-fallback")

    (result,) = run.results
    env = run.reports["main"].env
    assert result["request"] in ("accelerator/mig", "accelerator/vgpu")
    if result["request"] == "accelerator/mig":
        assert mig_profiles(env) == {f"{device_env_prefix(result['device'])}_PROFILE": MIG_PROFILE}
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    else:
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == VGPU_MPS_THREADS
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == VGPU_MPS_MEMORY
        assert not mig_profiles(env)


def test_the_admin_pod_sees_every_whole_gpu_of_its_node(
    run_example: RunExample, kubernetes_version: tuple[int, int]
) -> None:
    run = run_example("admin-monitoring")

    inventory = _expected_inventory(run.node, kubernetes_version)
    whole = sorted(device.name for device in inventory.devices if device.type == "gpu")
    assert sorted(result["device"] for result in run.results) == whole
    assert all(result.get("adminAccess") is True and result["driver"] == D for result in run.results)
    assert whole_gpu_uuids(run.reports["main"].env) == _gpu_env(run.node, *whole)


def test_two_pods_naming_one_claim_share_its_gpu(runner: _Runner) -> None:
    """A ResourceClaim both pods name: allocated once, one GPU for both, time-sliced."""
    runs = runner.run("gpu-shared-by-pods")

    assert len(runs) == 2
    (first,), (second,) = (run.results for run in runs)
    assert first["device"] == second["device"]
    assert runs[0].claim_uids == runs[1].claim_uids
    for run in runs:
        assert whole_gpu_uuids(run.reports["main"].env) == _gpu_env(run.node, first["device"])


def test_the_topology_examples_get_gpus_that_share_the_attribute(run_example: RunExample) -> None:
    """The real scheduler keeps matchAttribute on the standard attributes: two GPUs on one PCIe
    root, four on one NUMA node (the e2e node has four whole H100s on NUMA node 0)."""
    for name, attribute, count in (
        ("gpus-one-pcie-root", STANDARD_PCIE_ROOT, 2),
        ("gpus-one-numa-node", STANDARD_NUMA_NODE, 4),
    ):
        run = run_example(name)
        published = kube.published_devices(run.node)
        devices = [result["device"] for result in run.results]
        assert len(devices) == count, (name, devices)
        assert len({_attribute(published[device], attribute) for device in devices}) == 1, (name, devices)
        assert whole_gpu_uuids(run.reports["main"].env) == _gpu_env(run.node, *devices)
