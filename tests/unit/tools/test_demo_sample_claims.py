"""The demo's sample claims name a device the node offers, with the node config that makes it."""

from typing import Any

import pytest

from dra_driver.tools.demo.sample_claims import SampleClaimError, sample_claim
from tests.support.nodes import simulated_node


def allocated(claim: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results


def test_mig_takes_the_static_instances_a_node_has_before_making_dynamic_ones() -> None:
    static = sample_claim("mig", simulated_node("mixed", "n"), "n", "gpu.dra-driver.dev", "mixed")
    dynamic = sample_claim(
        "mig", simulated_node("dgx-h100-mig", "n"), "n", "gpu.dra-driver.dev", "dgx-h100-mig"
    )

    assert static.node_config is None
    assert allocated(static.claim) == [
        {"request": "device", "driver": "gpu.dra-driver.dev", "pool": "n", "device": "gpu-0-mig-1g10gb-2"}
    ]
    assert dynamic.node_config == {"gpus": [{"index": 0, "mode": "mig-dynamic"}]}


def test_a_vgpu_share_goes_on_the_first_gpu_outside_mig_mode_with_a_quarter_of_it() -> None:
    share = sample_claim("vgpu", simulated_node("mixed", "n"), "n", "gpu.dra-driver.dev", "mixed")

    assert share.node_config == {"gpus": [{"index": 4, "mode": "vgpu-capacity"}]}
    (result,) = allocated(share.claim)
    assert result["device"] == "gpu-4"
    assert result["consumedCapacity"] == {"memory": "20Gi", "cores": "25"}


def test_a_kind_the_node_cannot_offer_says_which_profiles_can() -> None:
    with pytest.raises(
        SampleClaimError, match=r"^--claim gpu: simulated:b200x8-mig has no GPU outside MIG mode"
    ):
        sample_claim(
            "gpu", simulated_node("b200x8-mig", "n"), "n", "gpu.dra-driver.dev", "simulated:b200x8-mig"
        )
