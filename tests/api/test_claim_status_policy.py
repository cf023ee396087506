"""The admission policy on the agent's ResourceClaim status writes, its CEL run by the real CEL
engine (cel-expr-python) on requests shaped like the API server's: the update the agent's own
status writer makes is allowed, and every way of touching another node's claim, the binding, or
another driver's entries is refused. A policy wrong in the permissive direction fails silently in
a working cluster, so only evaluating it shows that it holds."""

import copy
import uuid
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.device_status import status_update
from dra_driver.tools.manifests import ManifestOptions, render, service_account_username
from tests.support.admission_policy import denials, user_info

UID = str(uuid.uuid4())
POLICY = next(
    item
    for item in render(ManifestOptions())
    if item["kind"] == "ValidatingAdmissionPolicy" and item["metadata"]["name"].endswith("-node-claim-status")
)


def admit(
    new: dict[str, Any], old: dict[str, Any], username: str, node: str | None
) -> tuple[bool, list[str]]:
    """(allowed, denial messages) for an UPDATE of resourceclaims/status."""
    request = {"operation": "UPDATE", "userInfo": user_info(username, node)}
    found = denials(POLICY, "resourceclaims/status", request, new, old)
    return (True, []) if found is None else (not found, found)


AGENT = service_account_username("dra-driver")


def pinned_to(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


def claim(
    node_selector: dict[str, Any] | None = None, devices: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": "node-a", "device": "gpu-0"},
        {"request": "nic", "driver": "net.example.com", "pool": "nics", "device": "eth1"},
    ]
    allocation: dict[str, Any] = {"devices": {"results": results}}
    if node_selector is not None:
        allocation["nodeSelector"] = node_selector
    status: dict[str, Any] = {
        "allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}],
    }
    if devices is not None:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": UID, "resourceVersion": "5"},
        "spec": {"devices": {"requests": []}},
        "status": status,
    }


THEIRS = {"driver": "net.example.com", "pool": "nics", "device": "eth1", "data": {"mtu": 9000}}
OURS = {
    "driver": DEFAULT_DRIVER_NAME,
    "pool": "node-a",
    "device": "gpu-0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
            "message": "",
            "lastTransitionTime": "2026-11-24T10:00:00Z",
        }
    ],
    "data": {"gpuUUID": "GPU-1"},
}


def written(old: dict[str, Any]) -> dict[str, Any]:
    """What the agent's status writer PUTs for `old`."""
    body = status_update(
        ResourceClaimView.decode(old, DEFAULT_DRIVER_NAME), UID, DEFAULT_DRIVER_NAME, [OURS]
    ).body
    assert body is not None
    return body


@pytest.mark.parametrize("devices", [None, [THEIRS]], ids=["first-entry", "beside-another-driver"])
def test_the_agent_may_write_its_entries_on_its_own_nodes_claims(
    devices: list[dict[str, Any]] | None,
) -> None:
    old = claim(pinned_to("node-a"), devices)

    assert admit(written(old), old, AGENT, "node-a") == (True, [])


@pytest.mark.parametrize(
    "selector",
    [
        pinned_to("node-b"),
        None,
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]},
        {"nodeSelectorTerms": []},
    ],
    ids=["other-node", "not-pinned", "label-selector", "no-terms"],
)
def test_the_agent_may_not_write_claims_of_other_nodes(selector: dict[str, Any] | None) -> None:
    old = claim(selector)

    allowed, denials = admit(written(old), old, AGENT, "node-a")

    assert not allowed
    assert denials == [
        "the node agent on node-a may only write the status of claims allocated on its own node"
    ]


def test_a_claim_pinned_by_one_term_but_open_by_another_is_refused() -> None:
    selector = pinned_to("node-a")
    selector["nodeSelectorTerms"].append({"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
    old = claim(selector)

    assert not admit(written(old), old, AGENT, "node-a")[0]


def test_the_agent_may_not_touch_another_drivers_entries() -> None:
    old = claim(pinned_to("node-a"), [THEIRS])
    changed, removed = written(old), written(old)
    changed["status"]["devices"][0] = {**THEIRS, "data": {"mtu": 1500}}
    removed["status"]["devices"] = removed["status"]["devices"][1:]

    for new in (changed, removed):
        allowed, denials = admit(new, old, AGENT, "node-a")
        assert not allowed
        assert denials == [
            f"the node agent may only change the status.devices entries of {DEFAULT_DRIVER_NAME}"
        ]


def test_the_agent_may_not_change_the_binding() -> None:
    old = claim(pinned_to("node-a"))
    unreserved, reallocated = written(old), written(old)
    del unreserved["status"]["reservedFor"]
    reallocated["status"]["allocation"] = copy.deepcopy(reallocated["status"]["allocation"])
    reallocated["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"

    for new in (unreserved, reallocated):
        allowed, denials = admit(new, old, AGENT, "node-a")
        assert not allowed
        assert "the node agent may not change a claim's allocation or reservedFor" in denials


def test_a_token_not_bound_to_a_node_writes_no_status() -> None:
    old = claim(pinned_to("node-a"))

    allowed, denials = admit(written(old), old, AGENT, None)

    assert not allowed
    assert "the node agent's service-account token must be bound to a pod on a node" in denials


def test_the_policy_leaves_the_scheduler_and_others_alone() -> None:
    old = claim(pinned_to("node-b"))
    new = written(old)
    del new["status"]["reservedFor"]

    assert admit(new, old, "system:kube-scheduler", None) == (True, [])
    assert admit(new, old, service_account_username("elsewhere"), "node-a") == (True, [])
