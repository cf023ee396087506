"""`make cluster`: builds what the cache lacks, brings the cluster up step by step, installs the
driver with the chart, and returns once the Node is Ready and the agent's ResourceSlices are
published. It prints `export KUBECONFIG=...` and `export PATH=...` as lines of their own (also in
<cluster dir>/env.sh) and the components' log directory.

    python -m tests.cluster up|down|env       (E2E_KUBERNETES=1.34 for the oldest version)
"""

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from tests.cluster import agent_image, control_plane, driver, images, node, processes
from tests.cluster.build import build_all
from tests.cluster.configs import kubeconfig
from tests.cluster.layout import NODE_NAME, Layout
from tests.cluster.pki import client_identities, make_pki
from tests.cluster.teardown import SERVICES, tear_down
from tests.cluster.versions import KubernetesVersion
from tests.support.mock_nvml import build_library

T = TypeVar("T")
# Made once the cluster is up with the agent's slices published: a second `up` leaves it be.
READY_FILE = "ready"


def say(message: str) -> None:
    print(f"cluster: {message}", file=sys.stderr, flush=True)


def _step(what: str, action: Callable[[], T]) -> T:
    started = time.monotonic()
    result = action()
    say(f"{what} ({time.monotonic() - started:.1f}s)")
    return result


def kubectl_argv(layout: Layout, binaries: Mapping[str, Path]) -> list[str]:
    return [str(binaries["kubectl"]), "--kubeconfig", str(layout.kubeconfig("admin"))]


def environment_lines(layout: Layout, binaries: Mapping[str, Path]) -> list[str]:
    return [
        f"export KUBECONFIG={layout.kubeconfig('admin')}",
        f"export PATH={binaries['kubectl'].parent}:$PATH",
    ]


def running(layout: Layout) -> list[str]:
    return [name for name in SERVICES if processes.pid_of(layout, name) is not None]


def write_kubeconfigs(layout: Layout) -> None:
    pki = layout.pki
    for identity in client_identities(NODE_NAME):
        target = layout.kubeconfig(identity.stem)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            kubeconfig(
                control_plane.API_SERVER,
                pki / "ca.crt",
                pki / f"{identity.stem}.crt",
                pki / f"{identity.stem}.key",
            )
        )


def _wait_ready(layout: Layout, kubectl: list[str]) -> None:
    processes.wait_until("a Ready Node", lambda: node.node_ready(kubectl), 120, layout, "kubelet")


def up(layout: Layout, version: KubernetesVersion) -> list[str]:
    """The environment lines; a cluster already up is left as it is."""
    binaries = build_all(version)
    if (
        layout.environment_file.exists()
        and running(layout) == list(SERVICES[1:])
        and control_plane.api_ready(layout)
    ):
        say(f"already up in {layout.root}")
        return environment_lines(layout, binaries)
    if layout.root.exists():
        say(f"removing what an earlier cluster left in {layout.root}")
        tear_down(layout)
    started = time.monotonic()
    node_images = _step("images built", images.build_images)
    agent_tar, agent_name = _step("agent image built", agent_image.build_agent_image)
    _step("pod network bridge made", node.make_bridge)
    _step("certificates made", lambda: make_pki(layout.pki, NODE_NAME))
    write_kubeconfigs(layout)
    # Written now, so a cluster that fails to come up can be looked at with its own kubectl.
    lines = environment_lines(layout, binaries)
    layout.environment_file.write_text("\n".join(lines) + "\n")
    _step("etcd healthy", lambda: control_plane.start_etcd(layout, binaries))
    _step("API server ready", lambda: control_plane.start_api_server(layout, binaries, version))
    _step(
        "controller-manager and scheduler healthy",
        lambda: control_plane.start_controllers(layout, binaries, version),
    )
    _step("containerd serving", lambda: node.start_containerd(layout, binaries))
    _step("images imported", lambda: node.import_images(layout, binaries, [*node_images, agent_tar]))
    _step("mock NVIDIA driver installed", lambda: node.install_mock_driver(build_library()))
    kubectl = kubectl_argv(layout, binaries)
    _step("kubelet healthy", lambda: node.start_kubelet(layout, binaries, version))
    _step(f"node {NODE_NAME} Ready", lambda: _wait_ready(layout, kubectl))
    _step("kube-proxy healthy", lambda: node.start_kube_proxy(layout, binaries))
    _step("node labelled, namespace made", lambda: driver.prepare_node(kubectl))
    values = driver.local_values(agent_name, layout, version)
    say(_step("chart installed", lambda: driver.install_chart(layout.kubeconfig("admin"), values)))
    _step("agent rolled out", lambda: driver.wait_for_rollout(kubectl))
    devices = _step("ResourceSlices published", lambda: driver.wait_for_slices(kubectl))
    say(f"Kubernetes {version.release} up in {time.monotonic() - started:.0f}s, {devices} devices published")
    (layout.root / READY_FILE).touch()
    return lines


def main(argv: list[str] | None = None) -> int:
    from tests.cluster.build import BuildError  # noqa: PLC0415
    from tests.cluster.versions import kubernetes_version  # noqa: PLC0415

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("up", "down", "env"):
        print("usage: python -m tests.cluster up|down|env", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("cluster: run as root: kubelet, containerd and runc need it", file=sys.stderr)
        return 1
    layout = Layout.from_environment()
    if args[0] == "down":
        stopped = tear_down(layout)
        say(f"down: stopped {', '.join(stopped) or 'nothing (nothing was running)'}; {layout.root} removed")
        return 0
    try:
        version = kubernetes_version()
        lines = environment_lines(layout, build_all(version)) if args[0] == "env" else up(layout, version)
    except ValueError as error:
        print(f"cluster: {error}", file=sys.stderr)
        return 2
    except (BuildError, processes.ProcessError, node.NodeError, driver.DriverError) as error:
        print(f"cluster: {error}", file=sys.stderr)
        print(f"cluster: logs in {layout.logs}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    print(f"# logs: {layout.logs}")
    return 0
