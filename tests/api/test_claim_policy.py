"""The claim-shape policy (dra_driver/tools/manifests/claim_rules.py), evaluated by the real CEL
engine the way the API server runs it: the claims prepare would refuse are refused at creation,
and every example, and everything else, is let through. tests/e2e runs it on the real API server.
"""

from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME as D
from dra_driver.tools.manifests import ManifestOptions
from dra_driver.tools.manifests.claim_rules import claim_policy
from tests.support.admission_policy import denials
from tests.support.examples import documents, example_paths

POLICY = claim_policy(ManifestOptions())
USER = {"operation": "CREATE", "userInfo": {"username": "alice", "extra": {}}}
CONFIG = {"apiVersion": "resource.dra-driver.dev/v1alpha1"}


def request(name: str, device_class: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **fields}}


def claim(*requests: dict[str, Any], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": devices},
    }


def template(of: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": of["spec"]},
    }


def opaque(
    kind: str, requests: list[str] | None = None, driver: str = D, **parameters: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "opaque": {"driver": driver, "parameters": {**CONFIG, "kind": kind, **parameters}}
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


def refused(obj: dict[str, Any]) -> list[str]:
    resource = "resourceclaimtemplates" if obj["kind"] == "ResourceClaimTemplate" else "resourceclaims"
    found = denials(POLICY, resource, USER, obj, None)
    assert found is not None
    return found


VGPU, GPU, MIG = "vgpu.dra-driver.dev", "gpu.dra-driver.dev", "mig.dra-driver.dev"
SHARE = {"capacity": {"requests": {"memory": "10Gi"}}}


@pytest.mark.parametrize("path", example_paths(), ids=lambda path: path.stem)
def test_every_example_is_admitted(path: Any) -> None:
    for item in documents(path):
        if item["kind"] == "ResourceClaimTemplate":
            assert refused(item) == []


@pytest.mark.parametrize(
    "shape",
    [
        claim(request("vgpu", VGPU, **SHARE), request("gpu", GPU)),
        claim(request("vgpu", VGPU, count=2)),
        claim(request("vgpu", VGPU, allocationMode="All")),
        claim(request("a", VGPU), request("b", VGPU)),
        claim({"name": "x", "firstAvailable": [{"name": "v", "deviceClassName": VGPU, "count": 2}]}),
        claim({"name": "x", "firstAvailable": [{"name": "v", "deviceClassName": VGPU}]}, request("m", MIG)),
    ],
    ids=[
        "share-and-gpu",
        "two-shares-by-count",
        "all-shares",
        "two-share-requests",
        "fallback-count",
        "fallback-and-mig",
    ],
)
def test_a_share_with_other_devices_of_ours_is_refused_naming_the_rule(shape: dict[str, Any]) -> None:
    for obj in (shape, template(shape)):
        (message,) = refused(obj)
        assert "may ask for no other device" in message and VGPU in message


@pytest.mark.parametrize(
    "shape",
    [
        claim(request("vgpu", VGPU, **SHARE)),
        claim(request("vgpu", VGPU), request("watch", GPU, adminAccess=True, allocationMode="All")),
        claim(request("vgpu", VGPU), request("nic", "nic.example.com")),
        claim(request("a", GPU, count=2), request("b", MIG)),
        claim(),
    ],
    ids=["one-share", "share-and-admin", "share-and-another-driver", "no-share", "no-requests"],
)
def test_everything_else_is_admitted(shape: dict[str, Any]) -> None:
    assert refused(shape) == []
    assert refused(template(shape)) == []


@pytest.mark.parametrize(
    "config",
    [
        [opaque("GpuConfig")],
        [opaque("GpuConfig", ["m"])],
        [opaque("Colour")],
        [{"opaque": {"driver": D, "parameters": {"apiVersion": "v2", "kind": "MigDeviceConfig"}}}],
        [{"opaque": {"driver": D, "parameters": {"kind": "MigDeviceConfig"}}}],
    ],
    ids=["gpu-config-for-mig", "named-request", "unknown-kind", "other-api-version", "no-api-version"],
)
def test_a_config_that_does_not_fit_its_requests_is_refused(config: list[dict[str, Any]]) -> None:
    (message,) = refused(claim(request("m", MIG), config=config))
    assert "MigDeviceConfig for mig.dra-driver.dev" in message


@pytest.mark.parametrize(
    "config",
    [
        [opaque("MigDeviceConfig", ["m"]), opaque("GpuConfig", ["g"])],
        [opaque("GpuConfig", ["g"]), opaque("Anything", driver="other.example.com")],
        [
            opaque(
                "GpuConfig", ["g"], sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}
            )
        ],
    ],
    ids=["one-per-request", "another-drivers-config", "with-settings"],
)
def test_configs_that_fit_are_admitted(config: list[dict[str, Any]]) -> None:
    assert refused(claim(request("m", MIG), request("g", GPU), config=config)) == []


def test_a_config_for_a_fallback_fits_every_alternative_of_ours() -> None:
    fallback = {
        "name": "x",
        "firstAvailable": [{"name": "m", "deviceClassName": MIG}, {"name": "v", "deviceClassName": VGPU}],
    }

    assert refused(claim(fallback, config=[opaque("MigDeviceConfig")])) != []
    assert refused(claim(fallback, config=[opaque("MigDeviceConfig", ["x/m"])])) == []


MPS = {"strategy": "MPS"}
TIME_SLICING = {"strategy": "TimeSlicing"}


@pytest.mark.parametrize(
    "config",
    [
        [opaque("GpuConfig", ["g"], sharing=MPS)],
        [opaque("MigDeviceConfig", ["m"], sharing=MPS), opaque("GpuConfig", ["g"], sharing=TIME_SLICING)],
        # The last entry that applies wins: here it takes MPS away from "m" again.
        [
            opaque("GpuConfig", ["g"], sharing=MPS),
            opaque("MigDeviceConfig", ["m"], sharing=MPS),
            opaque("MigDeviceConfig", ["m"]),
        ],
    ],
    ids=["mps-on-one", "mps-and-time-slicing", "mps-overridden-for-one"],
)
def test_mps_on_some_requests_of_a_claim_but_not_all_is_refused(config: list[dict[str, Any]]) -> None:
    shape = claim(request("m", MIG), request("g", GPU), config=config)
    for obj in (shape, template(shape)):
        (message,) = refused(obj)
        assert "sharing strategy MPS must give it to all of them" in message


BOTH_MPS = [opaque("MigDeviceConfig", ["m"], sharing=MPS), opaque("GpuConfig", ["g"], sharing=MPS)]


@pytest.mark.parametrize(
    "shape",
    [
        claim(request("m", MIG), request("g", GPU), config=BOTH_MPS),
        claim(
            request("m", MIG),
            request("g", GPU),
            config=[*BOTH_MPS[:1], opaque("GpuConfig", ["g"], sharing=TIME_SLICING), *BOTH_MPS[1:]],
        ),
        claim(request("m", MIG), request("g", GPU), request("w", GPU, adminAccess=True), config=BOTH_MPS),
        claim(request("m", MIG), request("n", "nic.example.com"), config=BOTH_MPS[:1]),
    ],
    ids=["mps-on-both", "the-last-entry-wins", "admin-access-aside", "another-drivers-request-aside"],
)
def test_mps_on_every_request_of_ours_is_admitted(shape: dict[str, Any]) -> None:
    assert refused(shape) == []


GPU_MPS, GPU_TIME_SLICED = "gpu-mps.dra-driver.dev", "gpu-time-sliced.dra-driver.dev"


@pytest.mark.parametrize(
    "shape",
    [
        claim(request("m", MIG), request("g", GPU_MPS)),
        claim(request("a", GPU_MPS), request("b", GPU)),
        claim(request("a", GPU_MPS), request("b", GPU_TIME_SLICED)),
        claim(request("v", VGPU), request("g", GPU_MPS)),
    ],
    ids=["mps-class-and-mig", "mps-class-and-gpu", "mps-and-time-sliced-classes", "share-and-mps-class"],
)
def test_the_sharing_classes_count_as_their_strategy_and_as_ours(shape: dict[str, Any]) -> None:
    """A request of gpu-mps without a config of the claim runs under MPS (the class's config):
    with another request that does not, the claim is refused; and a share with it is a share
    with another device of ours."""
    assert refused(shape) != []


@pytest.mark.parametrize(
    "shape",
    [
        claim(request("a", GPU_MPS), request("b", GPU_MPS)),
        claim(
            request("a", GPU_MPS), request("m", MIG), config=[opaque("MigDeviceConfig", ["m"], sharing=MPS)]
        ),
        # The claim's config replaces the class's: here nothing runs under MPS.
        claim(
            request("a", GPU_MPS),
            request("b", GPU),
            config=[opaque("GpuConfig", ["a"], sharing=TIME_SLICING)],
        ),
        claim(request("t", GPU_TIME_SLICED), config=[opaque("GpuConfig", ["t"])]),
    ],
    ids=["two-mps-requests", "mps-class-and-mps-mig", "class-config-replaced", "gpu-config-fits-the-class"],
)
def test_sharing_class_claims_that_prepare_accepts_are_admitted(shape: dict[str, Any]) -> None:
    assert refused(shape) == []
