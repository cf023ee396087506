"""Which pod a process belongs to, from its cgroup path (/proc/<pid>/cgroup).

Kubelet puts every container in a cgroup under its pod's, named after the pod UID: with the
systemd driver `.../kubepods-burstable-pod<uid, dashes as underscores>.slice/cri-containerd-<id>.scope`,
with cgroupfs `.../kubepods/burstable/pod<uid>/<id>`. Reading another process's cgroup file
needs that process to be visible: the host PID namespace, or the host's /proc mounted in.
"""

import os
import re
from pathlib import Path

import msgspec

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")


class PodCgroup(msgspec.Struct, frozen=True):
    pod_uid: str
    # The runtime's container ID; empty where the path does not end in one (a pod-level process).
    container_id: str


def pod_cgroup(cgroup_file: str) -> PodCgroup | None:
    """The pod of a process from its cgroup file's text (v1 or v2); None: not a pod's process."""
    for line in cgroup_file.splitlines():
        path = line.split(":", 2)[-1]
        match = _POD.search(path)
        if match is None:
            continue
        last = path.rstrip("/").rsplit("/", 1)[-1]
        container = _CONTAINER.match(last)
        return PodCgroup(match.group(1).replace("_", "-"), container.group(1) if container else "")
    return None


def read_pod_cgroups(proc_root: Path, pids: set[int]) -> dict[int, PodCgroup | None]:
    """The pods of those `pids` whose cgroup can be read (None: not a pod's process); a process
    gone or hidden is absent.

    Plain strings and open(), not pathlib: pathlib interns every path part, and a fresh set of
    interned pid strings every sample grows the interpreter's intern table by megabytes."""
    found = {}
    root = os.fspath(proc_root)
    for pid in pids:
        try:
            with open(f"{root}/{pid}/cgroup", encoding="utf-8", errors="replace") as file:
                text = file.read()
        except OSError:
            continue
        found[pid] = pod_cgroup(text)
    return found


def pods_by_uid(pod_logs_dir: Path) -> dict[str, tuple[str, str]]:
    """(namespace, pod name) by pod UID, from kubelet's pod log directories
    (`<namespace>_<name>_<uid>`): namespaces and pod names cannot contain '_', so the split is exact."""
    pods = {}
    try:
        names = os.listdir(pod_logs_dir)
    except OSError:
        return {}
    for name in names:
        parts = name.split("_")
        if len(parts) == 3 and all(parts):
            pods[parts[2]] = (parts[0], parts[1])
    return pods
