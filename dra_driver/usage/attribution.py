"""Who uses how much of which GPU: the agent's prepared claims joined with kubelet's view of the
containers that use them and NVML's view of the processes on each device (pure).

The join, device by device:
- the claim's records say which of our devices it holds (and its vGPU share's limits);
- PodResources says which pods and containers use the claim (none known: one claim-level row);
- NVML says which processes run on the device. On a device only one claim and one pod use, every
  process on it is theirs; on a shared device (vGPU shares, time slicing, MPS) a process counts
  for a pod only when its cgroup names the pod, which needs the host's processes to be visible.
  Where that is unknown, the row has no memory or utilisation value rather than a wrong one.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

import msgspec

from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.usage import DeviceUsage, ProcessUsage

# A whole GPU by UUID, or one MIG device by its GPU's UUID and placement start.
UsageKey = tuple[str, int | None]
# The (namespace, pod) of a process whose cgroup was read but names no pod we know.
NO_POD = ("", "")


class DeviceUser(msgspec.Struct, frozen=True):
    """One container using one of our devices through a claim."""

    namespace: str
    pod: str
    container: str
    claim: str
    pool: str
    device: str
    share_id: str | None = None


class DeviceFacts(msgspec.Struct, frozen=True):
    """What a published device stands for, for usage: which GPU, and what a claim may use of it."""

    gpu_index: int
    gpu_uuid: str
    model: str
    usage_key: UsageKey
    memory_limit_bytes: int
    # Fraction of the GPU's compute (1 for a whole GPU; the SM share of a MIG or vGPU device).
    compute_limit: float


class GpuRow(msgspec.Struct, frozen=True):
    gpu: str
    uuid: str
    model: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization: float | None
    processes: int


class ClaimRow(msgspec.Struct, frozen=True):
    gpu: str
    uuid: str
    model: str
    device: str
    namespace: str
    pod: str
    container: str
    claim: str
    memory_limit_bytes: int
    compute_limit: float
    memory_used_bytes: int | None
    utilization: float | None


class UsageReport(msgspec.Struct, frozen=True):
    gpus: tuple[GpuRow, ...]
    claims: tuple[ClaimRow, ...]


def usage_key(usage: DeviceUsage) -> UsageKey:
    return (usage.gpu_uuid, usage.mig_placement_start)


def gpu_rows(usage: Iterable[DeviceUsage], index_of: Mapping[str, tuple[int, str]]) -> tuple[GpuRow, ...]:
    """One row per whole GPU NVML reports, allocated or not; `index_of` gives index and model by UUID."""
    rows = []
    for device in usage:
        if device.mig_uuid is not None:
            continue
        index, model = index_of.get(device.gpu_uuid, (-1, ""))
        rows.append(
            GpuRow(
                gpu=str(index) if index >= 0 else "",
                uuid=device.gpu_uuid,
                model=model,
                memory_used_bytes=device.memory_used_bytes,
                memory_total_bytes=device.memory_total_bytes,
                utilization=None if device.utilization_percent is None else device.utilization_percent / 100,
                processes=len(device.processes),
            )
        )
    return tuple(rows)


def _users_of(
    users: Iterable[DeviceUser] | None,
    namespace: str,
    claim: str,
    pool: str,
    device: str,
    share_id: str | None,
) -> list[tuple[str, str]]:
    """(pod, container) pairs using the claim's device; a pod with several such containers is one
    pair with container "" (processes are told apart by pod, not by container)."""
    containers: dict[str, set[str]] = defaultdict(set)
    for user in users or ():
        if (user.namespace, user.claim, user.pool, user.device) != (namespace, claim, pool, device):
            continue
        if share_id is not None and user.share_id is not None and user.share_id != share_id:
            continue
        containers[user.pod].add(user.container)
    return sorted((pod, next(iter(names)) if len(names) == 1 else "") for pod, names in containers.items())


def _memory(processes: list[ProcessUsage]) -> int | None:
    if any(p.memory_bytes is None for p in processes):
        return None
    return sum(p.memory_bytes or 0 for p in processes)


def _utilization(processes: list[ProcessUsage], device: DeviceUsage, alone: bool) -> float | None:
    """Per-process SM samples where NVML has them for every process; the device's own figure when
    the row is the device's only user; none of a shared device's processes: 0; otherwise unknown."""
    samples = [p.sm_percent for p in processes]
    if processes and all(s is not None for s in samples):
        return min(1.0, sum(s or 0.0 for s in samples) / 100)
    if alone:
        return None if device.utilization_percent is None else device.utilization_percent / 100
    return 0.0 if not processes else None


def attribute(
    claims: Iterable[ClaimRecord],
    facts: Mapping[str, DeviceFacts],
    usage: Iterable[DeviceUsage],
    users: Iterable[DeviceUser] | None,
    process_pods: Mapping[int, tuple[str, str]],
) -> tuple[ClaimRow, ...]:
    """One row per (claim, device, pod/container using it); a claim no known pod uses yet gets one
    row with empty pod and container, so its limits show from the moment it is prepared.

    `process_pods`: (namespace, pod name) of the processes whose cgroup could be read, NO_POD for
    those outside any known pod; a process missing from it makes a shared device's split unknown."""
    users = None if users is None else tuple(users)
    by_key = {usage_key(device): device for device in usage}
    held = [
        (record, prepared, facts[prepared.device])
        for record in claims
        if record.state == "prepared"
        for prepared in record.devices
        if prepared.device in facts
    ]
    holders = Counter(device_facts.usage_key for _record, _prepared, device_facts in held)
    rows = []
    for record, prepared, device_facts in held:
        ref = record.claim
        device = by_key.get(device_facts.usage_key)
        pods = _users_of(users, ref.namespace, ref.name, prepared.pool, prepared.device, prepared.share_id)
        memory_limit = prepared.memory_limit_bytes or device_facts.memory_limit_bytes
        compute_limit = (
            prepared.cores_limit / 100 if prepared.cores_limit is not None else device_facts.compute_limit
        )
        for pod, container in pods or [("", "")]:
            used: int | None = None
            utilization: float | None = None
            if device is not None:
                alone = holders[device_facts.usage_key] == 1 and len(pods) <= 1
                mine = [
                    p
                    for p in device.processes
                    if alone or (pod and process_pods.get(p.pid) == (ref.namespace, pod))
                ]
                known = alone or all(p.pid in process_pods for p in device.processes)
                used = _memory(mine) if known else None
                utilization = _utilization(mine, device, alone) if known else None
            rows.append(
                ClaimRow(
                    gpu=str(device_facts.gpu_index),
                    uuid=device_facts.gpu_uuid,
                    model=device_facts.model,
                    device=prepared.device,
                    namespace=ref.namespace,
                    pod=pod,
                    container=container,
                    claim=ref.name,
                    memory_limit_bytes=memory_limit,
                    compute_limit=compute_limit,
                    memory_used_bytes=used,
                    utilization=utilization,
                )
            )
    return tuple(rows)
