"""What hack/kind-up.sh installs: the Helm chart for the e2e node, and the same objects as
`dra-driver manifests` renders them.

kind-up.sh installs deploy/helm/dra-driver with `e2e_chart_values` (through helm-sdkpy, or the
helm CLI with the values this module prints); the API tests check that those values install
exactly `e2e_manifests` (tests/api/test_helm_chart.py), which they check against the upstream
schemas and the examples against the node's devices. The agent runs `--hardware nvml` on the
mock driver kind-up.sh unpacks on the worker (tests/e2e/mock_driver.py): the chart's driverRoot
points there and `extraEnv` at the mock's files. The node config (hack/e2e-node/) travels in a
ConfigMap.

    python -m tests.e2e.deploy values --image IMAGE            # the values, as JSON
    python -m tests.e2e.deploy install --image IMAGE --kubeconfig FILE --context NAME
"""

import argparse
import asyncio
import json
import sys
from typing import Any

from dra_driver.tools.manifests import DEFAULT_NAME, DEFAULT_NAMESPACE, ManifestOptions, chart_values, render
from tests.e2e.mock_driver import DRIVER_ROOT, mock_environment
from tests.support.examples import E2E_NODE_CONFIG_FILE, REPOSITORY

# hack/kind-up.sh labels the kind worker with this; the control plane stays without the agent.
NODE_LABEL = ("dra-driver.dev/e2e", "true")
CHART = REPOSITORY / "deploy" / "helm" / "dra-driver"
RELEASE = DEFAULT_NAME


def e2e_options(image: str) -> ManifestOptions:
    return ManifestOptions(
        image=image,
        hardware="nvml",
        driver_root=DRIVER_ROOT,
        node_configs={"default": E2E_NODE_CONFIG_FILE.read_text()},
        node_selector=dict([NODE_LABEL]),
        extra_env=mock_environment(),
    )


def e2e_manifest_args(image: str) -> list[str]:
    """The same installation as arguments of `dra-driver manifests`, relative to the repository
    root (for installing without Helm)."""
    return [
        "--image",
        image,
        "--hardware",
        "nvml",
        "--driver-root",
        DRIVER_ROOT,
        "--node-config",
        str(E2E_NODE_CONFIG_FILE.relative_to(REPOSITORY)),
        "--node-selector",
        "=".join(NODE_LABEL),
        *(
            argument
            for name, value in mock_environment().items()
            for argument in ("--env", f"{name}={value}")
        ),
    ]


def e2e_manifests(image: str) -> list[dict[str, Any]]:
    return render(e2e_options(image))


def e2e_chart_values(image: str) -> dict[str, Any]:
    return chart_values(e2e_options(image))


async def _install(image: str, kubeconfig: str | None, context: str | None) -> str:
    """`helm upgrade --install` through the Helm library: a second run rolls out a new image."""
    import helm_sdkpy  # noqa: PLC0415 - only kind-up needs it

    config = helm_sdkpy.Configuration(namespace=DEFAULT_NAMESPACE, kubeconfig=kubeconfig, kubecontext=context)
    result = await helm_sdkpy.Upgrade(config).run(
        RELEASE, str(CHART), values=e2e_chart_values(image), install=True, wait=False, timeout=180
    )
    return f"release {RELEASE} revision {result.get('version')}: {result.get('info', {}).get('status')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.deploy", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("values", "install"))
    parser.add_argument("--image", required=True)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    if args.action == "values":
        json.dump(e2e_chart_values(args.image), sys.stdout, indent=2)
        print()
        return 0
    print(asyncio.run(_install(args.image, args.kubeconfig, args.context)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
