"""References to judge a device order by: what better packing could have admitted.

- `BestFit`: a scoring allocator (which the scheduler is not): each claim goes to the fitting
  device whose GPU has the least memory left, and among MIG placements of that GPU to the one
  that blocks the fewest still-free placements of other profiles. Run like an order.
- `repacking_chooser`: a packer that may move every running claim at each arrival, so it never
  strands anything: it admits a claim whenever all running claims plus the new one fit the node
  together. It searches with the allocator model itself (one claim holding every running
  request, identical requests merged into one with a count), so it is exact, and exponential:
  use it on small nodes (1 or 2 GPUs). No allocator without migration refuses fewer claims at
  the same moment, so it is the reference on small cases; on large nodes the best of several
  orders and `BestFit` is.
"""

import random
from collections.abc import Mapping

from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.mig import memory_slice_counter
from dra_driver.devices.naming import counter_set_name, gpu_device_name
from dra_driver.devices.order import stranding_cost
from dra_driver.devices.origins import DynamicMig, VgpuShare
from dra_driver.hardware.model import Gpu
from dra_driver.packing.allocator import Allocation, Claim, DeviceResult, NodeState, Refusal, Request


def _memory_used(state: NodeState, gpu: Gpu, shared: bool) -> int:
    if shared:
        return state.consumed(gpu_device_name(gpu)).get("memory", 0)
    counters = state.counters_used().get(counter_set_name(gpu))
    if counters is not None:
        return counters.get("memory", 0)
    return gpu.memory_bytes if state.in_use(gpu_device_name(gpu)) else 0


class BestFit:
    """Best fit by GPU memory, then least stranding; for one-device claims."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def _stranding(self, state: NodeState, result: DeviceResult) -> float:
        origin = self.inventory.origin_of_device[result.device]
        if not isinstance(origin, DynamicMig):
            return 0.0
        used = state.counters_used().get(counter_set_name(origin.gpu), {})
        profiles = origin.gpu.mig_profiles
        return sum(
            stranding_cost(origin.profile, placement, (other,))
            for other in profiles
            for placement in other.placements
            if other.profile_id != origin.profile.profile_id
            and all(not used.get(memory_slice_counter(index)) for index in placement.memory_slices)
        )

    def __call__(self, state: NodeState, claim: Claim) -> Allocation | Refusal:
        (request,) = claim.requests
        options = state.fitting(request)
        if not options:
            return Refusal(f"request {request.name}: no device fits")

        def score(result: DeviceResult) -> tuple[float, ...]:
            origin = self.inventory.origin_of_device[result.device]
            free = origin.gpu.memory_bytes - _memory_used(state, origin.gpu, isinstance(origin, VgpuShare))
            return (free, self._stranding(state, result), state.index_of(result.device))

        return Allocation((min(options, key=score),))


def _key(request: Request) -> tuple[object, ...]:
    return (request.selector, tuple(sorted(request.capacity.items())))


class RepackingPacker:
    """Admits a claim whenever every running claim and it fit the node together."""

    def __init__(self, empty_node: NodeState, shared_devices: bool) -> None:
        self.empty = empty_node
        self.shared = shared_devices
        self.running: dict[tuple[object, ...], tuple[Request, int]] = {}

    def _requests(self, wanted: Mapping[tuple[object, ...], tuple[Request, int]]) -> list[Request]:
        if self.shared:
            # Shares of one shared device are separate requests (one request never takes a device twice).
            flat = [request for request, count in wanted.values() for _ in range(count)]
            return [replace(request, name=f"r{number}", count=1) for number, request in enumerate(flat)]
        return [
            replace(request, name=f"r{number}", count=count)
            for number, (request, count) in enumerate(wanted.values())
        ]

    def admit(self, request: Request) -> bool:
        wanted = dict(self.running)
        known, count = wanted.get(_key(request), (request, 0))
        wanted[_key(request)] = (known, count + 1)
        # The most constrained requests first: the search fails sooner.
        requests = sorted(self._requests(wanted), key=lambda r: len(self.empty.fitting(replace(r, count=1))))
        if isinstance(self.empty.allocate(Claim(tuple(requests))), Refusal):
            return False
        self.running = wanted
        return True

    def depart(self, request: Request) -> None:
        known, count = self.running[_key(request)]
        if count == 1:
            del self.running[_key(request)]
        else:
            self.running[_key(request)] = (known, count - 1)


def shuffled_within_gpus(inventory: Inventory, seed: int) -> Inventory:
    """The same GPU-after-GPU order with each GPU's devices in a random order: one of the
    'several orders' the large-node bound takes the best of."""
    rng = random.Random(seed)
    by_gpu: dict[str, list[int]] = {}
    for position, device in enumerate(inventory.devices):
        by_gpu.setdefault(inventory.gpu_of_device[device.name].uuid, []).append(position)
    devices = list(inventory.devices)
    reordered = []
    for positions in by_gpu.values():
        chosen = [devices[position] for position in positions]
        rng.shuffle(chosen)
        reordered.extend(chosen)
    return replace(inventory, devices=tuple(reordered))
