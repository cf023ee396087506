"""`demo --claim FILE` with the examples' own files: the demo does the scheduler's part, first
fit on its node, and writes each claim out allocated with its class's and its own configs."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.tools.demo.example_claims import example_claims, unallocated_specs
from dra_driver.tools.demo.sample_claims import SampleClaimError
from tests.support.examples import example_path
from tests.support.nodes import simulated_node

D = "gpu.dra-driver.dev"


def specs_of(name: str) -> list[tuple[str, dict[str, Any]]]:
    found = unallocated_specs(list(yaml.safe_load_all(example_path(name).read_text())))
    assert found is not None
    return found


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return found


def test_a_template_and_its_pod_become_one_allocated_claim() -> None:
    made = example_claims(specs_of("gpu-whole"), simulated_node("dgx-h100", "n"), "n", D, "dgx-h100")

    (claim,) = made.claims
    assert claim["metadata"]["name"] == "gpu-whole"
    assert results(claim) == [{"request": "gpu", "driver": D, "pool": "n", "device": "gpu-0"}]
    assert made.node_config is None and made.notes == ()


def test_a_sharing_class_brings_its_config_before_the_claims() -> None:
    made = example_claims(specs_of("mps-shared"), simulated_node("dgx-h100", "n"), "n", D, "dgx-h100")

    (claim,) = made.claims
    sources = [entry["source"] for entry in claim["status"]["allocation"]["devices"]["config"]]
    assert sources == ["FromClass", "FromClaim"]


def test_a_count_takes_that_many_devices_and_what_is_not_evaluated_is_said() -> None:
    made = example_claims(specs_of("gpus-one-numa-node"), simulated_node("dgx-h100", "n"), "n", D, "dgx-h100")
    (claim,) = made.claims
    assert [result["device"] for result in results(claim)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert made.notes == ("claim gpus-one-numa-node: constraints not evaluated (the scheduler's part)",)

    # The plain profile selector is read: the 1g.10gb placement, not the first MIG device.
    mig = example_claims(specs_of("mig-1g10gb"), simulated_node("dgx-h100-mig", "n"), "n", D, "dgx-h100-mig")
    assert mig.node_config == {"gpus": [{"index": 0, "mode": "mig-dynamic"}]}
    assert "-mig-1g10gb-" in results(mig.claims[0])[0]["device"] and mig.notes == ()

    cel = example_claims(specs_of("cel-selection"), simulated_node("dgx-h100", "n"), "n", D, "dgx-h100")
    assert "selectors not evaluated" in cel.notes[0]


def test_a_vgpu_share_keeps_its_capacity_requests() -> None:
    made = example_claims(specs_of("vgpu-10gi-30pct"), simulated_node("l4x8", "n"), "n", D, "l4x8")

    (result,) = results(made.claims[0])
    assert result["consumedCapacity"] == {"memory": "10Gi", "cores": "30"}
    assert result["shareID"]


def template(*requests: dict[str, Any]) -> list[dict[str, Any]]:
    spec = {"spec": {"devices": {"requests": list(requests)}}}
    return [{"kind": "ResourceClaimTemplate", "metadata": {"name": "x"}, "spec": spec}]


def exactly(name: str, device_class: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **fields}}


@pytest.mark.parametrize(
    ("documents", "said"),
    [
        (template(exactly("a", "nic.example.com")), "is not one of gpu.dra-driver.dev's"),
        (template(exactly("a", D), exactly("b", "mig.dra-driver.dev")), "give it claims of one kind"),
        (template(exactly("a", D, count=9)), "cannot offer the gpu devices"),
    ],
    ids=["another-drivers-class", "two-kinds", "too-many"],
)
def test_claims_the_demo_cannot_allocate_say_why(documents: list[dict[str, Any]], said: str) -> None:
    specs = unallocated_specs(documents)
    assert specs is not None
    with pytest.raises(SampleClaimError, match=said):
        example_claims(specs, simulated_node("dgx-h100", "n"), "n", D, "dgx-h100")


def test_a_file_of_allocated_claims_is_left_to_the_old_path(tmp_path: Path) -> None:
    allocated = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "status": {"allocation": {"devices": {}}},
    }
    assert unallocated_specs([allocated]) is None
