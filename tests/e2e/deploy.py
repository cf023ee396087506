"""What hack/kind-up.sh installs: `dra-driver manifests` for the e2e node.

kind-up.sh runs the command with exactly the arguments of `e2e_manifest_args`; the API tests
check the rendering against the upstream schemas and the examples against the node's devices.
The node files (hack/e2e-node/) travel in the rendering's ConfigMap.
"""

from typing import Any

from dra_driver.manifests import ManifestOptions, render
from tests.support.examples import E2E_HARDWARE_FILE, E2E_NODE_CONFIG_FILE, REPOSITORY

# hack/kind-up.sh labels the kind worker with this; the control plane stays without the agent.
NODE_LABEL = ("dra-driver.dev/e2e", "true")


def e2e_manifest_args(image: str) -> list[str]:
    """The arguments of `dra-driver manifests`, relative to the repository root."""
    return [
        "--image",
        image,
        "--hardware",
        f"simulated:{E2E_HARDWARE_FILE.relative_to(REPOSITORY)}",
        "--node-config",
        str(E2E_NODE_CONFIG_FILE.relative_to(REPOSITORY)),
        "--node-selector",
        "=".join(NODE_LABEL),
    ]


def e2e_manifests(image: str) -> list[dict[str, Any]]:
    return render(
        ManifestOptions(
            image=image,
            hardware=f"simulated:{E2E_HARDWARE_FILE.relative_to(REPOSITORY)}",
            simulated_node=E2E_HARDWARE_FILE.read_text(),
            node_config=E2E_NODE_CONFIG_FILE.read_text(),
            node_selector=dict([NODE_LABEL]),
        )
    )
