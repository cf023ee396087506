"""The MPS client limit is the scheduler's to keep: one MPS server takes 48 clients per GPU, and
the capacity-shared GPU publishes them as the capacity `clients` (every share takes one unless it
asks for more). A share that would be the GPU's 49th client is never allocated, so its pod waits
unschedulable with the scheduler's reason in its events, instead of being bound and then
refused by prepare (issue 48).

Two long-running pods hold 47 and 1 clients of the GPU; a third share does not fit.
"""

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME as D
from dra_driver.devices.vgpu import MPS_CLIENTS, MPS_CLIENTS_PER_GPU
from tests.e2e import kube, released
from tests.e2e.conftest import wait_phase
from tests.e2e.objects import claim_pod, claim_template


def _on_gpu(gpu_uuid: str) -> str:
    """Guarded: partitions have no uuid, and a selector that fails on any device fails the whole
    scheduling attempt (the real scheduler says so, suggesting optional chaining)."""
    return f'"uuid" in device.attributes["{D}"] && device.attributes["{D}"].uuid == "{gpu_uuid}"'


def _share(name: str, gpu_uuid: str, clients: int | None) -> list[dict[str, Any]]:
    """A share of the GPU `gpu_uuid` (the node has other vGPUs, which would take the 49th)."""
    capacity = {"memory": "1Gi", "cores": "1", **({MPS_CLIENTS: str(clients)} if clients else {})}
    request = {
        "deviceClassName": "vgpu.dra-driver.dev",
        "selectors": [{"cel": {"expression": _on_gpu(gpu_uuid)}}],
        "capacity": {"requests": capacity},
    }
    return [claim_template(name, request), claim_pod(name, [name], ["sleep", "3600"])]


@pytest.fixture
def shares(namespace: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    uids = [
        claim["metadata"]["uid"]
        for claim in kube.get("resourceclaims.resource.k8s.io", "--namespace", namespace)["items"]
    ]
    for name in names:
        kube.delete("pod", name, namespace)
        kube.delete("resourceclaimtemplate", name, namespace)
    released.wait_until_released(uids)


def _failed_scheduling(name: str, namespace: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        events = kube.get(
            "events", "--namespace", namespace, "--field-selector", f"involvedObject.name={name}"
        )["items"]
        messages = [event["message"] for event in events if event["reason"] == "FailedScheduling"]
        if messages or time.monotonic() > deadline:
            return messages
        time.sleep(1)


def test_the_49th_mps_client_of_a_gpu_is_unschedulable(
    shares: list[str], namespace: str, kubernetes_version: tuple[int, int], worker: str
) -> None:
    if kubernetes_version == (1, 34):
        pytest.skip("1.34 offers the capacity-shared GPU as partitions (its scheduler misallocates capacity)")
    published = kube.published_devices(worker)
    (shared,) = [name for name, device in published.items() if device.get("allowMultipleAllocations")]
    assert published[shared]["capacity"][MPS_CLIENTS]["value"] == str(MPS_CLIENTS_PER_GPU)
    (gpu_uuid,) = published[shared]["attributes"]["uuid"].values()

    for name, clients in (("clients-47", MPS_CLIENTS_PER_GPU - 1), ("clients-48th", None)):
        shares.append(name)
        kube.apply_objects(_share(name, gpu_uuid, clients), namespace)
        wait_phase(name, namespace, "Running")
    shares.append("clients-49th")
    kube.apply_objects(_share("clients-49th", gpu_uuid, None), namespace)

    messages = _failed_scheduling("clients-49th", namespace)
    assert messages and all("cannot allocate all claims" in message for message in messages), messages
    pod = kube.get("pod", "clients-49th", "--namespace", namespace)
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName"), pod["status"]
