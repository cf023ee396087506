"""etcd, the API server, the controller-manager and the scheduler on loopback: their flags
(pure, from the layout and the version) and starting each until it is healthy.

The flags are upstream's local-up-cluster choices trimmed to one node: RBAC and Node
authorization, NodeRestriction admission, a service-account issuer and signing key (both
mandatory), and the DRA feature gates the version needs for the driver's modes, the same list for
every component.
"""

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.cluster import processes
from tests.cluster.layout import (
    API_ADDRESS,
    API_PORT,
    CONTROLLER_MANAGER_PORT,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    SCHEDULER_PORT,
    SERVICE_RANGE,
    Layout,
)
from tests.cluster.versions import KubernetesVersion

API_SERVER = f"https://{API_ADDRESS}:{API_PORT}"
ETCD = f"http://127.0.0.1:{ETCD_CLIENT_PORT}"


def etcd_argv(binary: Path, layout: Layout) -> list[str]:
    peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
    return [
        str(binary),
        "--name=e2e",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={ETCD}",
        f"--advertise-client-urls={ETCD}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=e2e={peer}",
        "--log-level=warn",
    ]


def _gates(version: KubernetesVersion) -> list[str]:
    flag = version.feature_gate_flag()
    return [f"--feature-gates={flag}"] if flag else []


def api_server_argv(binary: Path, layout: Layout, version: KubernetesVersion) -> list[str]:
    pki = layout.pki
    return [
        str(binary),
        f"--etcd-servers={ETCD}",
        f"--bind-address={API_ADDRESS}",
        f"--advertise-address={API_ADDRESS}",
        f"--secure-port={API_PORT}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        # The node's name resolves nowhere (and a lookup would leave the machine): its address.
        "--kubelet-preferred-address-types=InternalIP",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--profiling=false",
        *_gates(version),
        *([f"--runtime-config={version.runtime_config}"] if version.runtime_config else []),
    ]


def _controller_flags(binary: Path, layout: Layout, user: str, port: int) -> list[str]:
    """One identity for the API and for checking its own callers, health on loopback."""
    kubeconfig = layout.kubeconfig(user)
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
    ]


def controller_manager_argv(binary: Path, layout: Layout, version: KubernetesVersion) -> list[str]:
    pki = layout.pki
    return [
        *_controller_flags(binary, layout, "kube-controller-manager", CONTROLLER_MANAGER_PORT),
        "--controllers=*",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true",
        "--leader-elect=false",
        "--profiling=false",
        *_gates(version),
    ]


def scheduler_argv(binary: Path, layout: Layout, version: KubernetesVersion) -> list[str]:
    return [
        *_controller_flags(binary, layout, "kube-scheduler", SCHEDULER_PORT),
        "--leader-elect=false",
        "--profiling=false",
        *_gates(version),
    ]


def api_ready(layout: Layout) -> bool:
    pki = layout.pki
    return processes.https_ok(f"{API_SERVER}/readyz", pki / "ca.crt", pki / "admin.crt", pki / "admin.key")


def _healthz_ok(port: int) -> bool:
    return processes.insecure_https_ok(f"https://127.0.0.1:{port}/healthz")


def start_etcd(layout: Layout, binaries: Mapping[str, Path]) -> None:
    processes.start(layout, "etcd", etcd_argv(binaries["etcd"], layout))
    processes.wait_until("healthy", lambda: processes.http_ok(f"{ETCD}/health"), 60, layout, "etcd")


def start_api_server(layout: Layout, binaries: Mapping[str, Path], version: KubernetesVersion) -> None:
    processes.start(layout, "kube-apiserver", api_server_argv(binaries["kube-apiserver"], layout, version))
    processes.wait_until("ready", lambda: api_ready(layout), 180, layout, "kube-apiserver")


def start_controllers(
    layout: Layout, binaries: Mapping[str, Path], version: KubernetesVersion, extra_flags: Sequence[str] = ()
) -> None:
    """The controller-manager and the scheduler, each until its /healthz answers; `extra_flags`
    are given to both."""
    processes.start(
        layout,
        "kube-controller-manager",
        [*controller_manager_argv(binaries["kube-controller-manager"], layout, version), *extra_flags],
    )
    processes.start(
        layout, "kube-scheduler", [*scheduler_argv(binaries["kube-scheduler"], layout, version), *extra_flags]
    )
    for name, port in (
        ("kube-controller-manager", CONTROLLER_MANAGER_PORT),
        ("kube-scheduler", SCHEDULER_PORT),
    ):
        processes.wait_until("healthy", functools.partial(_healthz_ok, port), 120, layout, name)
