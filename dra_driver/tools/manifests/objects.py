"""The whole installation as one ordered list of objects, and as the YAML stream printed."""

from typing import Any

import yaml

from dra_driver.devices.classes import device_classes
from dra_driver.tools.manifests.access import (
    admission_policy,
    admission_policy_binding,
    claim_status_policy,
    claim_status_policy_binding,
    cluster_role,
    cluster_role_binding,
    namespace_object,
    service_account,
)
from dra_driver.tools.manifests.claim_rules import claim_policy, claim_policy_binding
from dra_driver.tools.manifests.daemon_set import config_maps, daemon_set
from dra_driver.tools.manifests.extended import extended_resources
from dra_driver.tools.manifests.mps_access import (
    mps_admission_policy,
    mps_admission_policy_binding,
    mps_role,
    mps_role_binding,
)
from dra_driver.tools.manifests.options import ManifestOptions, common_labels
from dra_driver.tools.manifests.validation import check_options


def _device_classes(options: ManifestOptions) -> list[dict[str, Any]]:
    classes = device_classes(options.driver_name, extended_resources(options))
    for device_class in classes:
        device_class["metadata"]["labels"] = common_labels(options)
    return classes


def render(options: ManifestOptions) -> list[dict[str, Any]]:
    """The objects in the order `kubectl apply` needs them: the namespace before what lives in it,
    permissions and the policy before the agent that uses them, and the DeviceClasses last."""
    check_options(options)
    return [
        namespace_object(options),
        *config_maps(options),
        service_account(options),
        cluster_role(options),
        cluster_role_binding(options),
        admission_policy(options),
        admission_policy_binding(options),
        claim_status_policy(options),
        claim_status_policy_binding(options),
        mps_role(options),
        mps_role_binding(options),
        mps_admission_policy(options),
        mps_admission_policy_binding(options),
        *([claim_policy(options), claim_policy_binding(options)] if options.claim_policy else []),
        daemon_set(options),
        *_device_classes(options),
    ]


def render_yaml(options: ManifestOptions) -> str:
    """The objects as a YAML stream, headed by how it was made."""
    header = (
        f"# The DRA driver {options.driver_name}, rendered by `dra-driver manifests`; do not edit.\n"
        "# tests/api/test_manifests.py keeps deploy/dra-driver.yaml equal to the default rendering:\n"
        "#   dra-driver manifests > deploy/dra-driver.yaml\n"
        "# The Helm chart deploy/helm/dra-driver installs the same objects from values.\n"
    )
    # A wide line keeps each CEL expression on one line, where it reads as the CEL it is.
    return header + yaml.safe_dump_all(render(options), sort_keys=False, explicit_start=True, width=4096)
