"""Online best fit (issue 34's reference, `OnlineBestFit`): for each one-device claim, among
the devices of the requested shape that fit now, the one after which the most placements of the
largest shapes remain possible (largest first, then the next), ties to the static order. Taking
a device only changes what its own GPU can still hold, so the score is the loss vector of that
GPU alone (`GpuScorer`), memoised by the GPU's allocations; `ObservedState` keeps a scorer in
step with the node state a replay allocates from.

Apart from the live order (`live.py`) because it is the yardstick, not the order: the scorer is
what a live order consults to pick among fitting devices, and the best fit, an allocator that
scores, is what `live.py`'s first fit over a republished order is measured against. Pure, like
the allocator model it runs on.
"""

from collections import Counter
from collections.abc import Sequence

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device
from dra_driver.devices.naming import gpu_device_name
from dra_driver.packing.allocator import Allocation, Claim, DeviceResult, NodeState, Pool, Refusal, Request

# Placements of each scoring shape (largest first) that a GPU loses by one more allocation.
Loss = tuple[int, ...]


def _consumed_key(result: DeviceResult) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(result.consumed.items()))


class GpuScorer:
    """Best-fit scores per GPU: the loss vector of one more allocation, over `probes` (one-device
    requests, largest shape first). Follows the node's allocations through `add`/`remove`."""

    def __init__(self, inventory: Inventory, driver: str, probes: Sequence[Request]) -> None:
        self.probes = tuple(probes)
        devices_of: dict[str, list[Device]] = {}
        for device in inventory.devices:
            devices_of.setdefault(inventory.gpu_of_device[device.name].uuid, []).append(device)
        sets = {counter_set.name: counter_set for counter_set in inventory.counter_sets}
        self._local: dict[str, NodeState] = {}
        self._structure: dict[str, tuple[str, ...]] = {}
        self._gpu_of: dict[str, str] = {}
        self._position: dict[str, int] = {}
        self._held: dict[str, Counter[tuple[int, tuple[tuple[str, int], ...]]]] = {}
        for uuid, devices in devices_of.items():
            gpu = inventory.gpu_of_device[devices[0].name]
            used = {consumption.counter_set for device in devices for consumption in device.consumes_counters}
            pool = Pool(driver, tuple(devices), {name: dict(sets[name].counters) for name in sorted(used)})
            self._local[uuid] = NodeState(pool)
            prefix = len(gpu_device_name(gpu))
            # GPUs with the same devices (by name past the GPU's prefix) score alike: one memo.
            self._structure[uuid] = tuple(device.name[prefix:] for device in devices)
            self._held[uuid] = Counter()
            for position, device in enumerate(devices):
                self._gpu_of[device.name] = uuid
                self._position[device.name] = position
        self._counts: dict[tuple[object, ...], tuple[int, ...]] = {}
        self._losses: dict[tuple[object, ...], Loss] = {}

    def _signature(self, uuid: str) -> tuple[object, ...]:
        return (self._structure[uuid], tuple(sorted(self._held[uuid].elements())))

    def _change(self, allocation: Allocation, sign: int) -> None:
        for result in allocation.results:
            uuid = self._gpu_of[result.device]
            local = Allocation((result,))
            key = (self._position[result.device], _consumed_key(result))
            if sign > 0:
                self._local[uuid].add(local)
                self._held[uuid][key] += 1
            else:
                self._local[uuid].remove(local)
                self._held[uuid][key] -= 1
                if not self._held[uuid][key]:
                    del self._held[uuid][key]

    def add(self, allocation: Allocation) -> None:
        self._change(allocation, 1)

    def remove(self, allocation: Allocation) -> None:
        self._change(allocation, -1)

    def _remaining(self, uuid: str) -> tuple[int, ...]:
        local = self._local[uuid]
        return tuple(len(local.fitting(probe)) for probe in self.probes)

    def loss(self, result: DeviceResult) -> Loss:
        """What taking `result` (a device that fits now) costs its GPU, largest shape first."""
        uuid = self._gpu_of[result.device]
        signature = self._signature(uuid)
        key = (signature, self._position[result.device], _consumed_key(result))
        if (known := self._losses.get(key)) is not None:
            return known
        before = self._counts.get(signature)
        if before is None:
            before = self._counts[signature] = self._remaining(uuid)
        local = self._local[uuid]
        single = Allocation((result,))
        local.add(single)
        after = self._remaining(uuid)
        local.remove(single)
        loss = tuple(was - now for was, now in zip(before, after, strict=True))
        self._losses[key] = loss
        return loss


class ObservedState(NodeState):
    """The node state with a scorer following it (the replay only talks to the state)."""

    def __init__(self, pool: Pool, scorer: GpuScorer) -> None:
        self.scorer = scorer
        super().__init__(pool)

    def add(self, allocation: Allocation) -> None:
        super().add(allocation)
        self.scorer.add(allocation)

    def remove(self, allocation: Allocation) -> None:
        super().remove(allocation)
        self.scorer.remove(allocation)


def only_request(claim: Claim) -> Request:
    """The request of a one-device claim: the one kind the choosers here and in live.py serve."""
    (request,) = claim.requests
    return request


class OnlineBestFit:
    """The issue's online best fit, as a chooser for `simulate.replay` (on an `ObservedState`)."""

    def __init__(self, scorer: GpuScorer) -> None:
        self.scorer = scorer

    def __call__(self, state: NodeState, claim: Claim) -> Allocation | Refusal:
        request = only_request(claim)
        options = state.fitting(request)
        if not options:
            return Refusal(f"request {request.name}: no device fits")
        return Allocation((min(options, key=lambda r: (self.scorer.loss(r), state.index_of(r.device))),))
