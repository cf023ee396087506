"""The allocator model (`packing.allocator`) in lockstep with the real scheduler, and the
fleet's use over time, both from what the scheduler actually allocated.

For each arrival the model is asked the scheduler's question on the state the scheduler had (every
earlier placement, the scheduler's own): which devices of the node the scheduler chose would it
take, and could any node take a pod the scheduler refused. Which node the scheduler picks among
those that fit is its scoring's business (equal scores are broken at random), so the model is
checked on what is ours: the devices within a node, and whether a pod fits anywhere at all.
"""

from collections.abc import Mapping, Sequence

import msgspec

from dra_driver.devices import attributes as names
from dra_driver.devices.model import Device
from dra_driver.packing.allocator import Allocation, Claim, DeviceResult, NodeState, Pool
from dra_driver.packing.layout import compute_slices_of, device_gpu_uuid, device_memory
from tests.bench.cluster_scale.fleet import FleetNode
from tests.bench.cluster_scale.needs import ALL_CORES


class Placement(msgspec.Struct, frozen=True):
    """What the scheduler did with one pod: its node and devices, or None when it refused."""

    node: str | None
    allocation: Allocation | None = None


class Difference(msgspec.Struct, frozen=True):
    pod: int
    need: str
    scheduler: str
    model: str


def _held(device: Device, result: DeviceResult) -> tuple[int, int]:
    """Memory bytes and percent of the cores one result holds of its GPU."""
    if result.consumed:
        return result.consumed.get("memory", 0), result.consumed.get("cores", 0)
    if device.attributes.get(names.TYPE) == "mig":
        profile = str(device.attributes.get(names.PROFILE, ""))
        return device_memory(device), -(-compute_slices_of(profile) * ALL_CORES // 7)
    cores = device.capacity.get("cores")
    return device_memory(device), cores.value if cores is not None else ALL_CORES


def _results(allocation: Allocation) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
    return sorted((r.device, tuple(sorted(r.consumed.items()))) for r in allocation.results)


class FleetModel:
    def __init__(self, nodes: Sequence[FleetNode], driver: str) -> None:
        self.states = {node.name: NodeState(Pool.from_inventory(node.inventory, driver)) for node in nodes}
        self.devices = {node.name: dict(node.inventory.device_by_name) for node in nodes}
        self.gpu_memory: dict[str, int] = {}
        self.gpus_of_node: dict[str, list[str]] = {}
        for node in nodes:
            uuids = sorted({gpu.uuid for gpu in node.inventory.gpu_of_device.values()})
            self.gpus_of_node[node.name] = uuids
            for gpu in node.inventory.gpu_of_device.values():
                self.gpu_memory[gpu.uuid] = gpu.memory_bytes
        self.used_memory = dict.fromkeys(self.gpu_memory, 0)
        self.used_cores = dict.fromkeys(self.gpu_memory, 0)
        self.holders = dict.fromkeys(self.gpu_memory, 0)
        self.model_placed = 0
        self.model_refused = 0
        self.differences: list[Difference] = []

    def check(self, pod: int, label: str, claim: Claim, placement: Placement) -> None:
        """Compares the model's answer with the scheduler's, then records the scheduler's."""
        if placement.node is None or placement.allocation is None:
            fits = [
                name for name, state in self.states.items() if isinstance(state.allocate(claim), Allocation)
            ]
            if fits:
                self.model_placed += 1
                self.differences.append(Difference(pod, label, "refused", f"fits on {', '.join(fits[:3])}"))
            else:
                self.model_refused += 1
            return
        answer = self.states[placement.node].allocate(claim)
        if isinstance(answer, Allocation):
            self.model_placed += 1
            if _results(answer) != _results(placement.allocation):
                self.differences.append(
                    Difference(
                        pod,
                        label,
                        f"{placement.node}: {_results(placement.allocation)}",
                        str(_results(answer)),
                    )
                )
        else:
            self.model_refused += 1
            self.differences.append(
                Difference(pod, label, f"{placement.node}: {_results(placement.allocation)}", answer.reason)
            )
        self.add(placement.node, placement.allocation)

    def add(self, node: str, allocation: Allocation, sign: int = 1) -> None:
        state = self.states[node]
        state.add(allocation) if sign > 0 else state.remove(allocation)
        for result in allocation.results:
            device = self.devices[node][result.device]
            uuid = device_gpu_uuid(device)
            memory, cores = _held(device, result)
            self.used_memory[uuid] += sign * memory
            self.used_cores[uuid] += sign * cores
            self.holders[uuid] += sign

    def remove(self, node: str, allocation: Allocation) -> None:
        self.add(node, allocation, -1)

    def usage(self) -> Mapping[str, float]:
        """The fleet now: memory and compute allocated, fragments, and what 8-GPU jobs could get."""
        total = sum(self.gpu_memory.values())
        used = sum(min(self.used_memory[u], m) for u, m in self.gpu_memory.items())
        cores = sum(min(c, ALL_CORES) for c in self.used_cores.values())
        fragments = sum(
            m - min(self.used_memory[u], m) for u, m in self.gpu_memory.items() if self.holders[u]
        )
        free_nodes = sum(all(self.holders[u] == 0 for u in uuids) for uuids in self.gpus_of_node.values())
        return {
            "memory_allocated": used / total,
            "compute_allocated": cores / (ALL_CORES * len(self.gpu_memory)),
            "free_whole_gpus": float(sum(1 for held in self.holders.values() if held == 0)),
            "free_8gpu_nodes": float(free_nodes),
            "fragment_memory": fragments / total,
            "free_memory": (total - used) / total,
        }
