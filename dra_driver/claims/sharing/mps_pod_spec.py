"""The pod that runs one claim's MPS control daemon: data in, manifest out, nothing sent.

A daemon in a pod of its own outlives the agent (a rolling update, a crash, an OOM kill of the
agent's container end neither it nor the claim's workloads). The pod is the agent's twin on a
smaller scale: its image, its namespace, its node (`nodeName`, so no scheduler is involved and
the pod can only ever run where the claim's devices are), and just two host directories: the
driver root, read-only, where the control program and its libraries are, and the claim's own
MPS directory (pipes, logs, shared memory), which the agent prepared and the claim's containers
get too. The claim's shared memory directory is the daemon's /dev/shm, as it is every client's.

Why each setting, since the admission policy (tools/manifests/access.py) lets an agent create
nothing else:
- `privileged` only where the daemon drives real GPUs: its MPS server opens the claim's GPU
  device nodes, which a container's device cgroup refuses otherwise (NVIDIA's DRA driver runs its
  daemons privileged for the same reason). No hostPID, hostIPC or hostNetwork: MPS clients and
  server meet through the pipe directory's sockets and the shared /dev/shm directory.
- No service account token: the daemon never talks to the API server.
- `restartPolicy: Never`: a daemon that dies loses its defaults and its clients with it; the
  agent reports it instead of a kubelet restart hiding it.
- No owner reference to the ResourceClaim: owner references never cross namespaces, and one that
  names an owner in another namespace makes the garbage collector delete the pod at once. The
  claim UID is a label; the agent's start-up removes daemon pods no record owns, and kubelet
  unprepares a deleted claim once the agent is back.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from dra_driver.base.errors import ClaimFault
from dra_driver.claims.sharing.sharing import CONTAINER_SHM_DIRECTORY, MpsDaemonSpec
from dra_driver.kube.k8s_names import uid_problem

# What identifies a daemon pod; the admission policy and the start-up sweep rely on both.
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "mps-control-daemon"
CLAIM_UID_LABEL = "resource.kubernetes.io/claim-uid"
POD_NAME_PREFIX = "mps-"
CONTAINER_NAME = "mps-control-daemon"


class InvalidDaemonPod(ClaimFault, ValueError):
    """Something a daemon pod cannot be made from (a claim UID that is no UID)."""


class MpsPodSettings(msgspec.Struct, frozen=True):
    """Where the agent runs, which its daemon pods share.

    `driver_root`: where the agent sees the driver root (the control program's path is under it);
    `host_driver_root`: the same directory on the host, what the pod mounts there.
    """

    namespace: str
    node_name: str
    image: str
    driver_root: Path
    host_driver_root: Path
    command: tuple[str, ...]
    environment: Mapping[str, str]
    privileged: bool


def daemon_pod_name(claim_uid: str) -> str:
    """`mps-<claim UID>`: a valid, unique pod name, since a checked UID is lowercase hex and dashes."""
    if problem := uid_problem(claim_uid):
        raise InvalidDaemonPod(f"MPS daemon pod of a claim: uid: {problem}")
    return POD_NAME_PREFIX + claim_uid


def claim_uid_of(pod: Mapping[str, Any]) -> str | None:
    """The claim a daemon pod serves, from its label; None for a pod that is not one of ours."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    uid = labels.get(CLAIM_UID_LABEL)
    if labels.get(COMPONENT_LABEL) != COMPONENT or not isinstance(uid, str) or uid_problem(uid):
        return None
    return uid


def selector() -> str:
    return f"{COMPONENT_LABEL}={COMPONENT}"


def _host_path(name: str, path: Path, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": str(path), "type": kind}}


def _env(variables: Mapping[str, str]) -> Sequence[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in sorted(variables.items())]


def daemon_pod(spec: MpsDaemonSpec, settings: MpsPodSettings) -> dict[str, Any]:
    directories = spec.directories
    name = daemon_pod_name(directories.claim_uid)
    container = {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(settings.command),
        "env": _env({**settings.environment, **spec.daemon_environment()}),
        "securityContext": {"privileged": settings.privileged},
        "volumeMounts": [
            {"name": "driver-root", "mountPath": str(settings.driver_root), "readOnly": True},
            {"name": "mps", "mountPath": str(directories.root)},
            {"name": "shm", "mountPath": CONTAINER_SHM_DIRECTORY},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {COMPONENT_LABEL: COMPONENT, CLAIM_UID_LABEL: directories.claim_uid},
        },
        "spec": {
            "nodeName": settings.node_name,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            # Runs wherever the agent runs, whatever taints the node has.
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "volumes": [
                _host_path("driver-root", settings.host_driver_root, "Directory"),
                _host_path("mps", directories.root, "Directory"),
                _host_path("shm", directories.shm, "Directory"),
            ],
        },
    }
