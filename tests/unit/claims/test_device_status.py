"""The status.devices entries and their merge into what other drivers wrote (pure)."""

import uuid
from typing import Any

import pytest

from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.device_status import (
    MAX_DATA_BYTES,
    StatusTooLarge,
    device_status_entries,
    has_status_facts,
    merged_devices,
    status_update,
)
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import ClaimRecord, DeviceFacts, PreparedDevice

DRIVER = "gpu.dra-driver.dev"
UID = str(uuid.uuid4())
REF = claim_ref("default", "c", UID)
T0, T1 = "2026-11-24T10:00:00Z", "2026-11-24T11:00:00Z"


def ours(device: str, when: str = T0, status: str = "True") -> dict[str, Any]:
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "Prepared",
        "message": "",
        "lastTransitionTime": when,
    }
    return {"driver": DRIVER, "pool": "node-a", "device": device, "conditions": [condition], "data": {}}


def theirs(device: str) -> dict[str, Any]:
    return {"driver": "net.example.com", "pool": "nics", "device": device, "data": {"mtu": 9000}}


def claim(
    *devices: dict[str, Any], uid: str = UID, allocated: tuple[str, ...] = ("gpu-0",)
) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": name} for name in allocated]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if devices:
        status["devices"] = list(devices)
    return {
        "metadata": {"name": "c", "namespace": "default", "uid": uid, "resourceVersion": "7"},
        "status": status,
    }


def test_merge_keeps_other_entries_in_place_and_replaces_ours_by_key() -> None:
    merged = merged_devices(
        [theirs("eth0"), ours("gpu-0"), theirs("eth1")], [ours("gpu-0", T1), ours("gpu-1", T1)]
    )

    assert [(e["driver"], e["device"]) for e in merged] == [
        ("net.example.com", "eth0"),
        (DRIVER, "gpu-0"),
        ("net.example.com", "eth1"),
        (DRIVER, "gpu-1"),
    ]
    assert merged[0] == theirs("eth0") and merged[2] == theirs("eth1")


def test_a_condition_that_did_not_change_keeps_its_transition_time() -> None:
    (same,) = merged_devices([ours("gpu-0", T0)], [ours("gpu-0", T1)])
    (changed,) = merged_devices([ours("gpu-0", T0, status="False")], [ours("gpu-0", T1)])

    assert same["conditions"][0]["lastTransitionTime"] == T0
    assert changed["conditions"][0]["lastTransitionTime"] == T1


def test_an_update_keeps_the_resource_version_read_and_everything_else() -> None:
    read = claim(theirs("eth0"))

    update = status_update(ResourceClaimView.decode(read, DRIVER), UID, DRIVER, [ours("gpu-0")])

    assert update.outcome == "write" and update.body is not None
    assert update.body["metadata"]["resourceVersion"] == "7"
    assert update.body["status"]["allocation"] == read["status"]["allocation"]
    assert update.body["status"]["devices"] == [theirs("eth0"), ours("gpu-0")]


def test_what_is_stored_already_is_not_written_again() -> None:
    stored = ResourceClaimView.decode(claim(ours("gpu-0", T0)), DRIVER)
    assert status_update(stored, UID, DRIVER, [ours("gpu-0", T1)]).outcome == "unchanged"


@pytest.mark.parametrize(
    "read",
    [
        claim(uid=str(uuid.uuid4())),  # deleted and re-created under the same name
        claim(allocated=()),  # deallocated
        claim(allocated=("gpu-3",)),  # allocated other devices since
        {**claim(), "status": {}},  # deallocated, status.allocation gone
    ],
    ids=["replaced", "deallocated", "reallocated", "no-allocation"],
)
def test_a_claim_that_no_longer_holds_our_devices_is_gone(read: dict[str, Any]) -> None:
    assert (
        status_update(ResourceClaimView.decode(read, DRIVER), UID, DRIVER, [ours("gpu-0")]).outcome == "gone"
    )


def test_entries_say_what_the_record_keeps_and_refuse_data_over_10_ki() -> None:
    facts = DeviceFacts("vgpu", "GPU-1", 1)
    share = PreparedDevice(
        ("gpu",), "node-a", "gpu-1", ("k8s.x/claim=a",), None, "s-1", 8 * 2**30, 30, facts=facts
    )
    record = ClaimRecord(REF, (share,), generation=3)

    (entry,) = device_status_entries(DRIVER, record, now=T0)

    assert (entry["device"], entry["shareID"]) == ("gpu-1", "s-1")
    assert entry["data"] == {
        "type": "vgpu",
        "gpuUUID": "GPU-1",
        "gpuIndex": 1,
        "vgpu": {"memoryLimitMiB": 8192, "coresLimitPercent": 30},
        "cdiDeviceIDs": ["k8s.x/claim=a"],
    }
    assert entry["conditions"][0]["observedGeneration"] == 3
    assert entry["conditions"][0]["lastTransitionTime"] == T0
    huge = ClaimRecord(
        REF,
        (PreparedDevice(("gpu",), "node-a", "gpu-1", ("k8s.x/claim=" + "a" * MAX_DATA_BYTES,), facts=facts),),
    )
    with pytest.raises(StatusTooLarge, match="gpu-1"):
        device_status_entries(DRIVER, huge, now=T0)


def test_a_record_without_the_devices_facts_has_no_entries() -> None:
    """Records written before the facts were kept: the status is not guessed from the hardware."""
    old = ClaimRecord(REF, (PreparedDevice(("gpu",), "node-a", "gpu-1", ("k8s.x/claim=a",)),))
    kept = ClaimRecord(
        REF, (PreparedDevice(("gpu",), "node-a", "gpu-1", (), facts=DeviceFacts("gpu", "G", 0)),)
    )

    assert not has_status_facts(old)
    assert has_status_facts(kept)
    with pytest.raises(ValueError, match="gpu-1"):
        device_status_entries(DRIVER, old, now=T0)
