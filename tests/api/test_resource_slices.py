"""Every ResourceSlice the driver can publish is valid for Kubernetes 1.34 to 1.37, by the
upstream OpenAPI schemas in strict mode (unknown fields are errors)."""

from typing import Any

import kubernetes_validate
import pytest

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.slices import SliceLayout, plan_slices, slices_to_api
from dra_driver.hardware.model import MigMode
from tests.support.k8s_schemas import KUBERNETES_VERSIONS
from tests.support.nodes import all_profiles, mode_configs, simulated_node

LAYOUTS: list[SliceLayout] = ["1.34", "1.35"]


def published(profile: str, layout: SliceLayout) -> list[dict[str, Any]]:
    gpus = simulated_node(profile)
    slices = []
    for config in mode_configs(gpus).values():
        plan = plan_slices(node_inventory(gpus, config), layout)
        slices += slices_to_api(plan, "gpu.dra-driver.dev", "node-a")
    return slices


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("profile", all_profiles())
def test_every_slice_validates_against_every_supported_kubernetes(profile: str, layout: SliceLayout) -> None:
    for resource_slice in published(profile, layout):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(resource_slice, version, strict=True)


def test_the_schema_check_catches_a_broken_slice() -> None:
    """Guards the test above: a field the API does not have must fail validation."""
    (resource_slice, *_) = published("t4x4", "1.35")
    resource_slice["spec"]["devices"][0]["attributes"]["type"] = {"text": "gpu"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(resource_slice, "1.36.0", strict=True)


@pytest.mark.parametrize("profile", all_profiles())
def test_slices_naming_their_partition_type_validate_for_1_37_and_only_for_it(profile: str) -> None:
    gpus = simulated_node(profile)
    named = [
        resource_slice
        for config in mode_configs(gpus).values()
        for resource_slice in slices_to_api(
            plan_slices(node_inventory(gpus, config), "1.35"),
            "gpu.dra-driver.dev",
            "node-a",
            partition_types=True,
        )
        if "partitionTypeAttribute" in resource_slice["spec"]
    ]
    # vGPU partitions (mode_configs offers them on every GPU not in MIG mode) carry it; MIG never.
    assert bool(named) == any(gpu.mig_mode is not MigMode.ENABLED for gpu in gpus)
    for resource_slice in named:
        kubernetes_validate.validate(resource_slice, "1.37.0", strict=True)
        with pytest.raises(kubernetes_validate.ValidationError, match="partitionTypeAttribute"):
            kubernetes_validate.validate(resource_slice, "1.36.0", strict=True)
