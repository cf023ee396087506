"""Allocated means preparable, on the real scheduler and the real kubelet (issue 48): every pod
the scheduler binds reaches Running, so no claim it allocated is refused by prepare.

Hypothesis draws batches of claims of every kind the node offers (whole GPUs, one or two, bare,
time-sliced or under the claim's own MPS daemon; MIG devices of every profile the node
publishes, dynamic and static; vGPU shares, of memory, cores and MPS clients where the node
offers consumable capacity, any share where it offers partitions), each claim its own pod's,
created at once, as users do, through ResourceClaimTemplates. A batch settles when every pod
is Running or waits unschedulable; a pod bound to the node that does not run, or any
FailedPrepareDynamicResources event, fails the property, and so does a scheduling attempt
that failed for any reason but a want of devices (a missing class or a failing CEL selector:
the batch would then prove nothing). Each batch is deleted and
released before the next. tests/contract/test_allocated_means_preparable.py is the same
property on the allocator model with many more examples.

Claims that admission refuses (the claim-shape policy) are not drawn: the property is about
what reaches the scheduler.
"""

import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from dra_driver import DEFAULT_DRIVER_NAME as D
from dra_driver.devices.classes import class_name
from dra_driver.devices.model import DeviceType
from dra_driver.devices.vgpu import MPS_CLIENTS
from tests.e2e import kube, released
from tests.e2e.objects import claim_pod, claim_template

SETTLE_TIMEOUT = 180.0
# Each example is a batch on the real cluster (about half a minute); the model test explores.
EXAMPLES = 8
SHARINGS: tuple[dict[str, Any] | None, ...] = (
    None,
    {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
    {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}},
)
TYPES: tuple[DeviceType, ...] = ("gpu", "mig", "vgpu")
KINDS = {"gpu": "GpuConfig", "mig": "MigDeviceConfig"}

# A claim to draw: (device kind, count, sharing or None, MIG profile, vGPU capacity requests).
Drawn = tuple[DeviceType, int, dict[str, Any] | None, str | None, dict[str, str] | None]


class NodeOffer:
    """What the node publishes, read once: the MIG profiles, and whether vGPUs are shares of
    consumable capacity (1.35 and later) or partitions (1.34)."""

    def __init__(self, worker: str) -> None:
        devices = kube.published_devices(worker)
        self.mig_profiles = sorted(
            {
                device["attributes"]["profile"]["string"]
                for device in devices.values()
                if device["attributes"]["type"]["string"] == "mig"
            }
        )
        self.capacity_shares = any(device.get("allowMultipleAllocations") for device in devices.values())


@st.composite
def drawn_claims(draw: st.DrawFn, offer: NodeOffer) -> Drawn:
    kind: DeviceType = draw(st.sampled_from(TYPES))
    if kind == "gpu":
        return "gpu", draw(st.integers(1, 2)), draw(st.sampled_from(SHARINGS)), None, None
    if kind == "mig":
        sharing = draw(st.sampled_from((None, SHARINGS[2])))
        return "mig", 1, sharing, draw(st.sampled_from(offer.mig_profiles)), None
    if not offer.capacity_shares:
        return "vgpu", 1, None, None, None
    capacity = {"memory": f"{draw(st.integers(1, 24))}Gi", "cores": str(draw(st.integers(1, 60)))}
    if clients := draw(st.one_of(st.none(), st.integers(1, 3))):
        capacity[MPS_CLIENTS] = str(clients)
    return "vgpu", 1, None, None, capacity


def _request(drawn: Drawn) -> dict[str, Any]:
    kind, count, _, profile, capacity = drawn
    request: dict[str, Any] = {"deviceClassName": class_name(kind, D), "count": count}
    if profile is not None:
        request["selectors"] = [{"cel": {"expression": f'device.attributes["{D}"].profile == "{profile}"'}}]
    if capacity is not None:
        request["capacity"] = {"requests": capacity}
    return request


def _objects(name: str, drawn: Drawn) -> list[dict[str, Any]]:
    template = claim_template(name, _request(drawn))
    if (sharing := drawn[2]) is not None:
        parameters = {
            "apiVersion": "resource.dra-driver.dev/v1alpha1",
            "kind": KINDS[drawn[0]],
            "sharing": sharing,
        }
        template["spec"]["spec"]["devices"]["config"] = [{"opaque": {"driver": D, "parameters": parameters}}]
    return [template, claim_pod(name, [name], ["sleep", "3600"])]


def _events(namespace: str) -> list[dict[str, Any]]:
    return list(kube.get("events", "--namespace", namespace)["items"])


def _settled(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    if status.get("phase") == "Running":
        return True
    scheduled = [c for c in status.get("conditions", []) if c["type"] == "PodScheduled"]
    return not pod["spec"].get("nodeName") and any(
        c["status"] == "False" and c.get("reason") == "Unschedulable" for c in scheduled
    )


def _settle(names: list[str], namespace: str) -> dict[str, dict[str, Any]]:
    """Every pod once each runs or waits unschedulable; fails naming the pods that did neither."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        pods = {
            pod["metadata"]["name"]: pod
            for pod in kube.get("pods", "--namespace", namespace)["items"]
            if pod["metadata"]["name"] in names
        }
        if len(pods) == len(names) and all(_settled(pod) for pod in pods.values()):
            return pods
        if time.monotonic() > deadline:
            stuck = [name for name in names if name not in pods or not _settled(pods[name])]
            described = "\n".join(
                kube.kubectl("describe", "pod", name, "--namespace", namespace) for name in stuck
            )
            raise AssertionError(
                f"pods neither running nor unschedulable after {SETTLE_TIMEOUT:.0f}s:\n{described}"
            )
        time.sleep(2)


class Batches:
    """Numbers the batches (pod names are never reused, so events are told apart) and removes
    each batch with everything its claims left, before the next."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.count = 0
        self.names: list[str] = []

    def start(self, claims: list[Drawn]) -> list[str]:
        self.count += 1
        self.names = [f"prop-{self.count}-{index}" for index in range(len(claims))]
        objects = [
            item for name, drawn in zip(self.names, claims, strict=True) for item in _objects(name, drawn)
        ]
        kube.apply_objects(objects, self.namespace)
        return self.names

    def remove(self) -> None:
        pod_uids: set[str] = set()
        for name in self.names:
            pod = kube.get("pods", "--namespace", self.namespace, "--field-selector", f"metadata.name={name}")
            pod_uids.update(item["metadata"]["uid"] for item in pod["items"])
        claim_uids = [
            claim["metadata"]["uid"]
            for claim in kube.get("resourceclaims.resource.k8s.io", "--namespace", self.namespace)["items"]
            if {owner["uid"] for owner in claim["metadata"].get("ownerReferences", [])} & pod_uids
        ]
        for name in self.names:
            kube.delete("pod", name, self.namespace)
            kube.delete("resourceclaimtemplate", name, self.namespace)
        released.wait_until_released(claim_uids)
        self.names = []


@pytest.fixture(scope="module")
def offer(worker: str) -> NodeOffer:
    return NodeOffer(worker)


@pytest.fixture(scope="module")
def batches(namespace: str) -> Iterator[Batches]:
    made = Batches(namespace)
    yield made
    made.remove()


def test_every_pod_the_scheduler_binds_runs(offer: NodeOffer, batches: Batches, namespace: str) -> None:
    tricky: list[Drawn] = [
        ("gpu", 2, SHARINGS[2], None, None),
        ("mig", 1, SHARINGS[2], offer.mig_profiles[0], None),
        ("mig", 1, None, offer.mig_profiles[-1], None),
        (
            "vgpu",
            1,
            None,
            None,
            {"memory": "2Gi", "cores": "5", MPS_CLIENTS: "3"} if offer.capacity_shares else None,
        ),
    ]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),  # no shrinking: each step is a batch on the cluster
        suppress_health_check=(HealthCheck.too_slow, HealthCheck.function_scoped_fixture),
    )
    @example(tricky)
    @given(st.lists(drawn_claims(offer), min_size=4, max_size=10))
    def every_bound_pod_runs(claims: list[Drawn]) -> None:
        names = batches.start(claims)
        try:
            pods = _settle(names, namespace)
            ours = {pod["metadata"]["uid"] for pod in pods.values()}
            events = [event for event in _events(namespace) if event["involvedObject"].get("uid") in ours]
            failed = [
                f"{e['involvedObject']['name']}: {e['message']}"
                for e in events
                if e["reason"] == "FailedPrepareDynamicResources"
            ]
            assert not failed, f"prepare refused what the scheduler allocated: {failed}"
            # Unschedulable only for want of devices: a missing class or a failing selector
            # would leave pods waiting that prove nothing.
            not_fitting = [
                e["message"]
                for e in events
                if e["reason"] == "FailedScheduling" and "cannot allocate all claims" not in e["message"]
            ]
            assert not not_fitting, not_fitting
            assert any(pod["status"]["phase"] == "Running" for pod in pods.values()), "nothing ran"
        finally:
            batches.remove()

    every_bound_pod_runs()
