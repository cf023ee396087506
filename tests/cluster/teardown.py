"""`make cluster-down`: stops everything the cluster started and leaves no process, mount,
network device, cgroup or file behind, its own directory included.

Order matters: the pods' processes first (found by their cgroups under kubelet's cgroup root, and
the containerd shims by the containerd address on their command line, since shims outlive
containerd by design), then the services, then the mounts below the cluster's directory (pod
volumes, overlay roots, network namespaces), the pod network's bridge, the cgroups, and last the
files.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.cluster import processes
from tests.cluster.configs import NETWORK_NAME
from tests.cluster.layout import BRIDGE, CGROUP_ROOT, HOST_CDI_DIR, Layout
from tests.e2e.mock_driver import DRIVER_ROOT, MOCK_DIR

# Stopped in this order: the agent first (a host-process agent), kubelet before the runtime it
# calls, the control plane last.
SERVICES = (
    "dra-driver-agent",
    "kubelet",
    "kube-proxy",
    "containerd",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)
# The chart's host paths that the agent and the mock driver use outside the cluster directory.
_HOST_LEFTOVERS = (Path(DRIVER_ROOT).parent, Path(MOCK_DIR).parent)


def _cgroup_dirs() -> list[Path]:
    """Every cgroup directory under kubelet's cgroup root, in every hierarchy, deepest first."""
    found: list[Path] = []
    base = Path("/sys/fs/cgroup")
    for hierarchy in [base, *(path for path in base.iterdir() if path.is_dir())] if base.is_dir() else []:
        top = hierarchy / CGROUP_ROOT
        if top.is_dir():
            found += [Path(root) for root, _, _ in os.walk(top)]
    return sorted(set(found), key=lambda path: len(path.parts), reverse=True)


def _cgroup_pids(directories: list[Path]) -> set[int]:
    pids: set[int] = set()
    for directory in directories:
        try:
            pids |= {int(line) for line in (directory / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            continue
    return pids


def _shim_pids(layout: Layout) -> set[int]:
    address = str(layout.containerd_socket)
    pids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address.encode() in argv:
            pids.add(int(entry.name))
    return pids


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(processes.alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _mounts_below(root: Path) -> list[str]:
    """Mount points at or below `root` (and the host leftovers), deepest first."""
    prefixes = [str(path) for path in (root, *_HOST_LEFTOVERS)]
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == prefix or point.startswith(prefix + "/") for prefix in prefixes):
            points.append(point)
    return sorted(set(points), key=len, reverse=True)


def _unmount_all(root: Path) -> None:
    for _ in range(5):
        points = _mounts_below(root)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def _remove_bridge() -> None:
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)


def _remove_cgroups() -> None:
    for directory in _cgroup_dirs():
        for _ in range(20):
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                _kill(_cgroup_pids([directory]))
                time.sleep(0.1)


def _remove_agent_files() -> None:
    """The agent's CDI specs in the chart's host CDI directory (its spec files are named after
    the driver), and the chart's and the mock's host directories."""
    if HOST_CDI_DIR.is_dir():
        for spec in HOST_CDI_DIR.glob("dra-driver*"):
            spec.unlink(missing_ok=True)
    for directory in _HOST_LEFTOVERS:
        shutil.rmtree(directory, ignore_errors=True)


def _remove_container_log_links(root: Path) -> None:
    """kubelet links each container's log into /var/log/containers, a path it does not let one
    configure; the links into the cluster's pod log directory go, and the directory if empty."""
    links = Path("/var/log/containers")
    if not links.is_dir():
        return
    for link in links.iterdir():
        if link.is_symlink() and str(link.readlink()).startswith(str(root) + "/"):
            link.unlink()
    with contextlib.suppress(OSError):
        links.rmdir()


_IPTABLES = (("iptables-save", "iptables-restore"), ("ip6tables-save", "ip6tables-restore"))


def _saved_tables(save: str) -> str:
    try:
        return subprocess.run([save], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return ""


def _iptables_chains() -> list[str]:
    """The KUBE-* chains kubelet and kube-proxy made in the host's tables, IPv4 and IPv6."""
    return sorted(
        {
            line.split()[0][1:]
            for save, _ in _IPTABLES
            for line in _saved_tables(save).splitlines()
            if line.startswith(":KUBE-")
        }
    )


def _clean_iptables() -> None:
    """The host's tables without every KUBE-* chain and every rule that names one: kubelet's
    canaries and firewall chain and kube-proxy's service chains outlive both processes, and are
    not in the cluster's directory. Other rules (podman's, say) are restored as they were."""
    for save, restore in _IPTABLES:
        saved = _saved_tables(save)
        if "KUBE-" not in saved:
            continue
        kept = "\n".join(line for line in saved.splitlines() if "KUBE-" not in line) + "\n"
        subprocess.run([restore], input=kept, capture_output=True, text=True, check=False)


def _remove_runtime_directories() -> None:
    """containerd's shims keep their sockets in /run/containerd/s whatever the state directory
    (a path compiled in), and the CRI plugin its fifos in /run/containerd/fifo; with the shims
    gone, the directory holds nothing of anyone's."""
    runtime = Path("/run/containerd")
    if runtime.is_dir() and {entry.name for entry in runtime.iterdir()} <= {"s", "fifo", "runc"}:
        shutil.rmtree(runtime, ignore_errors=True)


def _remove_cni_cache() -> None:
    """libcni caches each attachment's result in /var/lib/cni/results (not configurable through
    containerd): the cluster network's entries go, and the directories if empty."""
    results = Path("/var/lib/cni/results")
    if not results.is_dir():
        return
    for entry in results.iterdir():
        if entry.name.startswith((f"{NETWORK_NAME}-", "cni-loopback-")):
            entry.unlink(missing_ok=True)
    for directory in (results, results.parent):
        try:
            directory.rmdir()
        except OSError:
            return


def tear_down(layout: Layout) -> list[str]:
    """What was stopped, in order; the cluster's directory is gone afterwards."""
    stopped: list[str] = []
    for name in SERVICES[:3]:
        if processes.stop(layout, name):
            stopped.append(name)
    _kill(_cgroup_pids(_cgroup_dirs()) | _shim_pids(layout))
    for name in SERVICES[3:]:
        if processes.stop(layout, name):
            stopped.append(name)
    _kill(_shim_pids(layout))
    _clean_iptables()
    _remove_runtime_directories()
    _remove_cni_cache()
    _unmount_all(layout.root)
    _remove_bridge()
    _remove_cgroups()
    _remove_agent_files()
    _remove_container_log_links(layout.root)
    shutil.rmtree(layout.root, ignore_errors=True)
    return stopped


def leftovers(layout: Layout) -> list[str]:
    """What tear_down should have removed and did not: the test of cluster-down reads this."""
    found: list[str] = []
    found += [f"mount {point}" for point in _mounts_below(layout.root)]
    found += [f"cgroup {directory}" for directory in _cgroup_dirs()]
    found += [f"shim {pid}" for pid in _shim_pids(layout)]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"network device {BRIDGE}")
    found += [f"iptables chain {chain}" for chain in _iptables_chains()]
    found += [
        f"path {path}" for path in (layout.root, *_HOST_LEFTOVERS, Path("/run/containerd")) if path.exists()
    ]
    return found
