"""The fields Kubernetes 1.36 and 1.37 added to the DRA objects, per version: kept where the gate
is on, dropped before validation where it is off, and refused where the version's schema lacks
the field, as the real API server does."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.apiserver import ApiServer, default_disabled_features
from tests.support.claims import claim_body
from tests.unit.support.test_standin_apiserver import CLAIMS, DRIVER, SLICES, raw, slice_body

CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
VERSIONS = ("1.34", "1.35", "1.36", "1.37")
PARTITION_TYPE = f"{DRIVER}/partitionType"


@pytest.fixture
def make_server() -> Iterator[Callable[..., ApiServer]]:
    started: list[ApiServer] = []

    def make(version: str, **options: Any) -> ApiServer:
        started.append(ApiServer(version, install_types=True, **options).start())
        return started[-1]

    yield make
    for server in started:
        server.stop()


# -- DeviceClass spec.extendedResourceName (DRAExtendedResource) --------------------------------------


def device_class(name: str = "gpu.example.com") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": "true"}}], "extendedResourceName": "nvidia.com/gpu"},
    }


@pytest.mark.parametrize(
    ("version", "kept"), [("1.34", False), ("1.35", False), ("1.36", True), ("1.37", True)]
)
def test_extended_resource_name_is_kept_from_1_36_and_dropped_before(
    make_server: Callable[..., ApiServer], version: str, kept: bool
) -> None:
    code, stored = raw(make_server(version), "POST", CLASSES, device_class())

    assert code == 201, stored
    assert ("extendedResourceName" in stored["spec"]) == kept


def test_extended_resource_name_is_dropped_where_its_gate_is_turned_off(
    make_server: Callable[..., ApiServer],
) -> None:
    server = make_server("1.37", disabled_features={"DRAExtendedResource"})

    code, stored = raw(server, "POST", CLASSES, device_class())
    assert code == 201 and "extendedResourceName" not in stored["spec"]
    # An update of a class that already has it keeps it (the real server's ratcheting).
    server.set_disabled_features(())
    _, with_name = raw(server, "POST", CLASSES, device_class("other.example.com"))
    server.set_disabled_features({"DRAExtendedResource"})
    code, updated = raw(server, "PUT", f"{CLASSES}/other.example.com", with_name)
    assert code == 200 and updated["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_extended_resource_name_of_the_wrong_type_is_refused_where_it_is_kept(
    make_server: Callable[..., ApiServer],
) -> None:
    body = device_class()
    body["spec"]["extendedResourceName"] = 7
    # Where the gate is off the stand-in drops the field before validating (the real server would
    # already refuse the wrong JSON type when decoding, which the stand-in does not model).
    for version in ("1.36", "1.37"):
        code, status = raw(make_server(version), "POST", CLASSES, body)
        assert code == 422 and "extendedResourceName" in status["message"], version


# -- ResourceSlice spec.partitionTypeAttribute (DRAPartitionableDevicesType, alpha 1.37) ---------------


def partitioned_slice(attribute: str = PARTITION_TYPE, **device: Any) -> dict[str, Any]:
    """A slice of two vGPU partitions drawing from a counter set published elsewhere in the pool."""
    devices = [
        {
            "name": f"gpu-0-vgpu-10gi-{slot}",
            "attributes": {PARTITION_TYPE: {"string": "gpu-0-vgpu-10gi"}},
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}],
            **device,
        }
        for slot in range(2)
    ]
    return slice_body(devices=devices, partitionTypeAttribute=attribute)


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36"])
def test_partition_type_attribute_is_an_unknown_field_before_1_37(
    make_server: Callable[..., ApiServer], version: str
) -> None:
    server = make_server(version)
    code, stored = raw(server, "POST", SLICES, partitioned_slice())
    assert code == 201 and "partitionTypeAttribute" not in stored["spec"]

    code, status = raw(server, "POST", SLICES + "?fieldValidation=Strict", partitioned_slice())
    assert code == 400 and 'unknown field "spec.partitionTypeAttribute"' in status["message"]


def test_partition_type_attribute_is_dropped_by_1_37_with_its_alpha_gate_off_by_default(
    make_server: Callable[..., ApiServer],
) -> None:
    server = make_server("1.37")
    assert "DRAPartitionableDevicesType" in server.disabled_features

    code, stored = raw(server, "POST", SLICES, partitioned_slice())

    assert code == 201 and "partitionTypeAttribute" not in stored["spec"]
    assert stored["spec"]["devices"][0]["attributes"] == {PARTITION_TYPE: {"string": "gpu-0-vgpu-10gi"}}


def test_partition_type_attribute_is_kept_by_1_37_with_its_gate_on(
    make_server: Callable[..., ApiServer],
) -> None:
    code, stored = raw(make_server("1.37", disabled_features=()), "POST", SLICES, partitioned_slice())

    assert code == 201 and stored["spec"]["partitionTypeAttribute"] == PARTITION_TYPE


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (partitioned_slice(attributes={}), "Required value"),
        (partitioned_slice(attributes={PARTITION_TYPE: {"int": 10}}), "as a string"),
        (partitioned_slice(consumesCounters=None), "no device of the slice consumes counters"),
        (partitioned_slice("partitionType"), "fully qualified"),
    ],
    ids=["attribute-missing", "not-a-string", "no-counters", "not-qualified"],
)
def test_a_partition_type_attribute_the_devices_do_not_carry_is_refused(
    make_server: Callable[..., ApiServer], body: dict[str, Any], problem: str
) -> None:
    for device in body["spec"]["devices"]:
        if device.get("consumesCounters", ...) is None:
            del device["consumesCounters"]

    code, status = raw(make_server("1.37", disabled_features=()), "POST", SLICES, body)

    assert code == 422 and problem in status["message"], status["message"]


def test_the_short_name_of_an_attribute_in_the_drivers_domain_counts(
    make_server: Callable[..., ApiServer],
) -> None:
    body = partitioned_slice(attributes={"partitionType": {"string": "gpu-0-vgpu-10gi"}})

    assert raw(make_server("1.37", disabled_features=()), "POST", SLICES, body)[0] == 201


def test_a_gate_the_version_does_not_have_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"\['DRAPartitionableDevicesType'\] do not exist in Kubernetes 1.36"
    ):
        ApiServer("1.36", disabled_features={"DRAPartitionableDevicesType"})


# -- ResourceClaim status.devices (DRAResourceClaimDeviceStatus, on since 1.33) ------------------------


def device_status() -> dict[str, Any]:
    return {
        "devices": [
            {
                "driver": DRIVER,
                "pool": "node-a",
                "device": "gpu-0",
                "data": {"uuid": "GPU-0"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Prepared",
                        "message": "",
                        "lastTransitionTime": "2026-11-24T00:00:00Z",
                    }
                ],
            }
        ]
    }


def write_status(server: ApiServer, name: str, status: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    _, claim = raw(server, "GET", f"{CLAIMS}/{name}")
    return raw(server, "PUT", f"{CLAIMS}/{name}/status", {**claim, "status": status})


@pytest.mark.parametrize("version", VERSIONS)
def test_claim_device_status_is_kept_by_every_version(
    make_server: Callable[..., ApiServer], version: str
) -> None:
    server = make_server(version)
    assert "DRAResourceClaimDeviceStatus" not in default_disabled_features(server.minor)
    raw(server, "POST", CLAIMS, claim_body("c", ["gpu"]))

    code, stored = write_status(server, "c", device_status())

    assert code == 200 and stored["status"] == device_status()


def test_claim_device_status_is_dropped_where_its_gate_is_off_unless_already_there(
    make_server: Callable[..., ApiServer],
) -> None:
    server = make_server("1.36", disabled_features={"DRAResourceClaimDeviceStatus"})
    for name in ("new", "old"):
        raw(server, "POST", CLAIMS, claim_body(name, ["gpu"]))

    code, stored = write_status(server, "new", device_status())
    assert code == 200 and "devices" not in stored.get("status", {})

    server.set_disabled_features(())
    write_status(server, "old", device_status())
    server.set_disabled_features({"DRAResourceClaimDeviceStatus"})
    changed = device_status()
    changed["devices"][0]["data"] = {"uuid": "GPU-1"}
    code, stored = write_status(server, "old", changed)
    assert code == 200 and stored["status"] == changed


@pytest.mark.parametrize("version", VERSIONS)
def test_claim_device_status_with_an_unknown_field_is_stored_without_it(
    make_server: Callable[..., ApiServer], version: str
) -> None:
    server = make_server(version)
    raw(server, "POST", CLAIMS, claim_body("c", ["gpu"]))
    status = device_status()
    status["devices"][0]["colour"] = "green"

    code, answer = write_status(server, "c", status)

    # Dropped with a warning, as the real server does without fieldValidation=Strict.
    assert code == 200 and "colour" not in answer["status"]["devices"][0]
