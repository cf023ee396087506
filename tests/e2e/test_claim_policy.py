"""The claim-shape policy on the real API server (dra_driver/tools/manifests/claim_rules.py):
the server compiles it, and a claim that prepare would refuse is refused at creation with the
rule's message, before any pod is bound; the examples, run by the other tests, pass it."""

import json
from typing import Any

import pytest

from dra_driver.tools.manifests import ManifestOptions
from dra_driver.tools.manifests.claim_rules import claim_policy_name
from tests.e2e import kube
from tests.e2e.objects import claim_template

CONFIG = {"apiVersion": "resource.dra-driver.dev/v1alpha1"}


def _refusal(obj: dict[str, Any], namespace: str) -> str:
    """What kubectl said when the server refused to create `obj`."""
    with pytest.raises(kube.KubectlError) as refused:
        kube.kubectl("create", "--namespace", namespace, "-f", "-", stdin=json.dumps(obj))
    return str(refused.value)


def test_the_policy_is_installed_and_compiles() -> None:
    policy = kube.get("validatingadmissionpolicy", claim_policy_name(ManifestOptions()))

    # The server reports expressions it cannot compile or type-check here.
    assert not policy.get("status", {}).get("typeChecking", {}).get("expressionWarnings"), policy["status"]


@pytest.mark.parametrize(
    ("name", "devices", "said"),
    [
        (
            "share-and-gpu",
            {
                "requests": [
                    {"name": "vgpu", "exactly": {"deviceClassName": "vgpu.dra-driver.dev"}},
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-driver.dev"}},
                ]
            },
            "may ask for no other device",
        ),
        (
            "gpu-config-for-mig",
            {
                "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.dra-driver.dev"}}],
                "config": [
                    {
                        "opaque": {
                            "driver": "gpu.dra-driver.dev",
                            "parameters": {**CONFIG, "kind": "GpuConfig"},
                        }
                    }
                ],
            },
            "MigDeviceConfig for mig.dra-driver.dev",
        ),
        (
            "mps-on-one-request",
            {
                "requests": [
                    {"name": "mig", "exactly": {"deviceClassName": "mig.dra-driver.dev"}},
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-driver.dev"}},
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": "gpu.dra-driver.dev",
                            "parameters": {**CONFIG, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}},
                        },
                    }
                ],
            },
            "sharing strategy MPS must give it to all of them",
        ),
    ],
)
def test_a_claim_prepare_would_refuse_is_refused_at_creation(
    namespace: str, name: str, devices: dict[str, Any], said: str
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }
    template = claim_template(name, {"deviceClassName": "x"})
    template["spec"] = {"spec": {"devices": devices}}

    for obj in (claim, template):
        message = _refusal(obj, namespace)
        assert claim_policy_name(ManifestOptions()) in message and said in message, message
