"""The benchmark's cluster: etcd, the API server, the controller-manager and the scheduler of the
e2e tier's build (tests/cluster), and kwok for the nodes, with no kubelet and no containers.

kwok keeps each fake Node Ready (its status and lease) and moves each pod bound to one to
Running, which is all the scheduler and the controllers need to see: the scheduler allocates
claims from the ResourceSlices our slice controller publishes, the resourceclaim controller makes
claims from templates and removes them when their pods go. Nothing is prepared: fake nodes have
no plugin registration and no CDI. It lives in a directory of its own and uses the e2e cluster's
ports and bridge, so it refuses to start while that cluster is up.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.bench.cluster_scale.kwok_stages import stages_yaml
from tests.cluster import control_plane, node, processes
from tests.cluster.build import build, build_all, kwok_component
from tests.cluster.layout import API_ADDRESS, API_PORT, BRIDGE, Layout
from tests.cluster.pki import make_pki
from tests.cluster.up import write_kubeconfigs
from tests.cluster.versions import KubernetesVersion

BENCH_ROOT = Path("/tmp/dra-bench")
# Annotation kwok selects the nodes it keeps by (its documented default is this key).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Stopped in this order: the node simulator, then the control plane.
SERVICES = ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
# The certificate's node identity is never used: kwok acts as the admin.
_UNUSED_NODE = "kwok"
_LISTEN = "0A"
# The controllers' own client rate limits (20 and 50 requests/s by default) would pace the
# benchmark, not the scheduler's work: each pod costs the resourceclaim controller a claim, a
# pod status update and, when it leaves, a claim update and delete. Raised as scheduler_perf
# runs its scheduler (no client limit) for the same reason.
CLIENT_RATE_FLAGS = ("--kube-api-qps=1000", "--kube-api-burst=2000")


class HarnessError(Exception):
    pass


def say(message: str) -> None:
    print(f"cluster-scale: {message}", file=sys.stderr, flush=True)


def _listening(port: int) -> bool:
    """Whether a process of this machine listens on the TCP port (any address). Read from
    /proc/net/tcp: a connect would tell nothing, since this machine's network answers connects to
    addresses it does not route."""
    wanted = f":{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(wanted) and fields[3] == _LISTEN:
            return True
    return False


def kwok_argv(binary: Path, layout: Layout) -> list[str]:
    return [
        str(binary),
        f"--config={layout.root / 'kwok-stages.yaml'}",
        f"--kubeconfig={layout.kubeconfig('admin')}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        "--node-lease-duration-seconds=40",
        # Pod addresses kwok reports; nothing is routed to them.
        "--cidr=10.244.0.0/16",
        "--node-ip=10.88.0.2",
    ]


def bring_up(version: KubernetesVersion) -> Layout:
    """The control plane and kwok, healthy; builds what the cache lacks."""
    layout = Layout(BENCH_ROOT)
    tear_down(layout)
    if _listening(API_PORT):
        raise HarnessError(
            f"port {API_PORT} of {API_ADDRESS} is in use: another cluster runs "
            "(make cluster-down stops the e2e one)"
        )
    binaries = build_all(version)
    kwok = build(kwok_component()) / "kwok"
    node.make_bridge()
    make_pki(layout.pki, _UNUSED_NODE)
    write_kubeconfigs(layout)
    control_plane.start_etcd(layout, binaries)
    control_plane.start_api_server(layout, binaries, version)
    control_plane.start_controllers(layout, binaries, version, CLIENT_RATE_FLAGS)
    (layout.root / "kwok-stages.yaml").write_text(stages_yaml())
    processes.start(layout, "kwok", kwok_argv(kwok, layout))
    say(f"control plane of Kubernetes {version.release} and kwok up in {layout.root} (logs {layout.logs})")
    return layout


def kubectl(layout: Layout, version: KubernetesVersion) -> list[str]:
    return [str(build_all(version)["kubectl"]), "--kubeconfig", str(layout.kubeconfig("admin"))]


def tear_down(layout: Layout) -> None:
    """Stops what an earlier run left and removes its directory and the bridge."""
    if not layout.root.exists():
        return
    for name in SERVICES:
        processes.stop(layout, name)
    if Path(f"/sys/class/net/{BRIDGE}").exists() and not _listening(API_PORT):
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
    shutil.rmtree(layout.root, ignore_errors=True)


def rss_mib(layout: Layout) -> dict[str, float]:
    """Each running service's resident memory, for the footprint the docs state."""
    found: dict[str, float] = {}
    for name in SERVICES:
        pid = processes.pid_of(layout, name)
        if pid is None:
            continue
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                found[name] = int(line.split()[1]) / 1024
    return found
