"""The Kubernetes versions the local cluster runs, and the feature gates each needs for the
driver's modes: one table, which the "Kubernetes versions and feature gates" table of
docs/install.md is checked against (tests/cluster/test_versions.py reads the pinned modules' own
feature lists).

Each version's components come from hack/cluster/modules/kubernetes-<minor>, whose go.mod pins
the exact release; the node's other parts (etcd, containerd, runc, CNI plugins) are shared by
every version.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
MODULES = REPOSITORY / "hack" / "cluster" / "modules"
# `make e2e` runs this one unless E2E_KUBERNETES names another minor ("1.34").
NEWEST = "1.37"
SUPPORTED = ("1.34", "1.37")


@dataclass(frozen=True, slots=True)
class Gate:
    """A feature gate of ours: which driver feature needs it and, per minor version, its stage
    and default as that release's pkg/features/kube_features.go declares it."""

    name: str
    needed_by: str
    # minor -> (stage, default on)
    stages: dict[str, tuple[str, bool]]


# Read from each release's pkg/features/kube_features.go (1.34.4, 1.35.4, 1.36.3, 1.37.2).
GATES = (
    Gate(
        "DynamicResourceAllocation",
        "everything",
        dict.fromkeys(("1.34", "1.35", "1.36", "1.37"), ("GA", True)),
    ),
    Gate(
        "DRAPartitionableDevices",
        "`mig-dynamic`, `vgpu-partitions` (and their MPS client counter)",
        {"1.34": ("alpha", False), "1.35": ("alpha", False), "1.36": ("beta", True), "1.37": ("beta", True)},
    ),
    Gate(
        "DRAConsumableCapacity",
        "`vgpu-capacity` (and its MPS `clients` capacity)",
        {"1.34": ("alpha", False), "1.35": ("alpha", False), "1.36": ("beta", True), "1.37": ("beta", True)},
    ),
    Gate(
        "DRADeviceTaints",
        "XID taints on devices",
        {"1.34": ("alpha", False), "1.35": ("alpha", False), "1.36": ("beta", True), "1.37": ("GA", True)},
    ),
    Gate(
        "DRADeviceTaintRules",
        "eviction by a DeviceTaintRule (not used by the agent)",
        {"1.35": ("alpha", False), "1.36": ("beta", False), "1.37": ("GA", True)},
    ),
    Gate(
        "DRAExtendedResource",
        "`nvidia.com/gpu` extended resources",
        {"1.34": ("alpha", False), "1.35": ("alpha", False), "1.36": ("beta", True), "1.37": ("GA", True)},
    ),
    Gate(
        "DRAPrioritizedList",
        "`firstAvailable` in claims (an example)",
        {"1.34": ("beta", True), "1.35": ("beta", True), "1.36": ("GA", True), "1.37": ("GA", True)},
    ),
    Gate(
        "DRAAdminAccess",
        "admin-access claims (an example)",
        {"1.34": ("beta", True), "1.35": ("beta", True), "1.36": ("GA", True), "1.37": ("GA", True)},
    ),
    Gate(
        "ResourceHealthStatus",
        "device health in pod status (kubelet)",
        {"1.34": ("alpha", False), "1.35": ("alpha", False), "1.36": ("beta", True), "1.37": ("beta", True)},
    ),
)
# Gates the cluster does not turn on although they exist, on every version: nothing of ours
# needs DeviceTaintRules.
_NOT_TURNED_ON = frozenset({"DRADeviceTaintRules"})
# ... and on one version. 1.34.4's scheduler with DRAConsumableCapacity on (its experimental
# allocator) indexes the ResourceSlice's devices by the request's device count so far: a share is
# checked against the wrong device's capacity (why the agent offers no capacity shares on 1.34),
# and a request for more devices than a slice of one of them holds panics the Filter ("index out
# of range [6] with length 5", allocator_experimental.go:1142: admin access to all of a node's
# GPUs). The agent uses nothing of the gate on 1.34, so the cluster leaves it off, as 1.34 does.
_OFF_ON: dict[str, frozenset[str]] = {"1.34": frozenset({"DRAConsumableCapacity"})}


MINORS = ("1.34", "1.35", "1.36", "1.37")


def _cell(stage: tuple[str, bool] | None) -> str:
    if stage is None:
        return "—"
    name, default = stage
    return "GA" if name == "GA" else f"{name}, {'on' if default else 'off'}"


def gate_table() -> str:
    """The table of gates in docs/install.md, as Markdown: tests/api/test_readme.py keeps the two
    equal."""
    lines = [
        f"| feature gate | what of ours needs it | {' | '.join(MINORS)} |",
        "|---|---|" + "---|" * len(MINORS),
    ]
    lines += [
        f"| `{gate.name}` | {gate.needed_by} | {' | '.join(_cell(gate.stages.get(m)) for m in MINORS)} |"
        for gate in GATES
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class KubernetesVersion:
    minor: str  # "1.37"
    release: str  # "v1.37.2", from the module's go.mod

    @property
    def module(self) -> Path:
        return MODULES / f"kubernetes-{self.minor}"

    @property
    def feature_gates(self) -> dict[str, bool]:
        """Every gate of ours that exists in this version but is off by default, turned on; the
        same list goes to the API server, scheduler, controller-manager and kubelet."""
        return {
            gate.name: True
            for gate in GATES
            if self.minor in gate.stages
            and not gate.stages[self.minor][1]
            and gate.name not in _NOT_TURNED_ON
            and gate.name not in _OFF_ON.get(self.minor, frozenset())
        }

    @property
    def runtime_config(self) -> str | None:
        """API versions to serve beyond the defaults. With DRADeviceTaints on while it is alpha,
        the scheduler and the controller-manager list DeviceTaintRules from resource.k8s.io/
        v1alpha3, which the API server serves only when asked; without it the scheduler's cache
        never syncs and it schedules nothing (seen on 1.34.4)."""
        if self.feature_gates.get("DRADeviceTaints") and _stage(self.minor, "DRADeviceTaints") == "alpha":
            return "resource.k8s.io/v1alpha3=true"
        return None

    def feature_gate_flag(self) -> str:
        return ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.feature_gates.items()))


def _stage(minor: str, name: str) -> str:
    (gate,) = (gate for gate in GATES if gate.name == name)
    return gate.stages[minor][0]


_REQUIRE = re.compile(r"^require k8s\.io/kubernetes (v[0-9.]+)$", re.M)


def kubernetes_version(minor: str | None = None) -> KubernetesVersion:
    """The pinned release of `minor` (default: E2E_KUBERNETES, else the newest supported)."""
    chosen = minor or os.environ.get("E2E_KUBERNETES") or NEWEST
    if chosen not in SUPPORTED:
        raise ValueError(f"E2E_KUBERNETES={chosen!r}: expected one of {', '.join(SUPPORTED)}")
    go_mod = (MODULES / f"kubernetes-{chosen}" / "go.mod").read_text()
    match = _REQUIRE.search(go_mod)
    if match is None:
        raise ValueError(
            f"hack/cluster/modules/kubernetes-{chosen}/go.mod: no 'require k8s.io/kubernetes v…'"
        )
    return KubernetesVersion(minor=chosen, release=match.group(1))
