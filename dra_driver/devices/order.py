"""The order devices are published in, which is the order the scheduler tries them.

The scheduler's allocator does no scoring: each request takes the first device that fits, in
slice-name order and then list order (`packing.allocator` has the facts). So the published
order is the node's packing policy, and a good one makes first fit behave like best fit:

- binpack (the default): GPU after GPU, so one GPU's partitions are used before the next GPU
  is touched and whole GPUs stay free for big claims. Within a GPU, small devices come first
  and each MIG profile's placements are listed from the one that strands the least. First,
  placements that orphan a memory slice go last: a slice is orphaned when every placement
  that could still use it overlaps this one (on the 8-slice GPUs a 1g at slice 6 orphans
  slice 7, which only the 1g.20gb at 6, the 3g at 4 and the 7g reach, so its memory is lost
  while that 1g runs). Then the placement blocking the fewest placements of the other
  profiles, weighted by how rare those are (blocking the only 4g placement costs more than
  blocking one of four 1g.20gb ones). Ties go to the higher start, since the big profiles all
  start at slice 0. On H100, A100, H200 and B200 the 1g placements come as slices 5, 4, 3, 2,
  1, 0, 6 (a local search over seeded traces pointed there; on unseen seeds it refuses 1-3 %
  fewer MIG claims than the rule without orphans, docs/drafts/packing2.md). vGPU partitions:
  smallest size first, the whole GPU last (no per-size GPU order did better on the traces).
- spread: the same order within a GPU except that orphans do not count (1g from slice 6
  down), but round-robin over the GPUs, so the first claim of each GPU's best slot goes to
  every GPU before any GPU gets a second tenant.

Names never change (an allocated device keeps its name, and names parse back); only the
position in the slices does, and the order is a pure function of the node's plans, so it never
changes while the GPUs' plans stay the same: no republishing, no extra API writes.
"""

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Literal

from dra_driver.devices.model import Device
from dra_driver.devices.naming import natural_key
from dra_driver.devices.origins import (
    DeviceOrigin,
    DynamicMig,
    StaticMig,
    VgpuPartition,
)
from dra_driver.hardware.model import MigProfile, Placement

PackingPolicy = Literal["binpack", "spread"]

# (kind, size, tie-breakers...): the rank of a device among the devices of its GPU.
WithinGpuKey = tuple[int | str, ...]


def _overlaps(first: Placement, second: Placement) -> bool:
    return first.start < second.start + second.size and second.start < first.start + first.size


def stranding_cost(profile: MigProfile, placement: Placement, profiles: Sequence[MigProfile]) -> float:
    """How much taking this placement costs the other profiles: for each placement of another
    profile it overlaps, the share of that profile's placements it takes away."""
    return sum(
        sum(_overlaps(placement, theirs) for theirs in other.placements) / len(other.placements)
        for other in profiles
        if other.profile_id != profile.profile_id and other.placements
    )


def orphaned_slices(placement: Placement, profiles: Sequence[MigProfile]) -> int:
    """Memory slices outside `placement` that some placement of `profiles` can use on an empty
    GPU but none can once `placement` is taken: memory lost while it runs, whatever comes next."""
    reachable = {
        index for profile in profiles for theirs in profile.placements for index in theirs.memory_slices
    }
    still = {
        index
        for profile in profiles
        for theirs in profile.placements
        if not _overlaps(placement, theirs)
        for index in theirs.memory_slices
    }
    return len(reachable - still - set(placement.memory_slices))


def _within_gpu(origin: DeviceOrigin, profiles: Sequence[MigProfile], packed: bool) -> WithinGpuKey:
    match origin:
        case DynamicMig(profile=profile, placement=placement):
            # Orphans only count where GPUs fill up (binpack). Under spread each GPU holds a few
            # tenants, and the 1g at slice 5 would block 2g and 1g.20gb at 4 on every GPU: on the
            # 8-GPU traces spread refused 7-12 % more MIG claims with orphans counted.
            orphans = orphaned_slices(placement, profiles) if packed else 0
            cost = round(stranding_cost(profile, placement, profiles) * 1000)
            return (0, placement.size, profile.compute_slices, profile.name, orphans, cost, -placement.start)
        case StaticMig(profile=profile, instance=instance):
            return (
                0,
                instance.placement.size,
                profile.compute_slices,
                profile.name,
                instance.placement.start,
            )
        case VgpuPartition(memory_bytes=memory, slot=slot):
            return (0, memory, slot)
        case _:
            # Last on its GPU: it is the GPU whole (or all of it shared; a mode's own kind that
            # has no case here, such as a GPU given to a VM, is its GPU whole too).
            return (1,)


def name_ordered(devices: Sequence[Device]) -> tuple[Device, ...]:
    """Plain name order: what was published before issue 25, the packing benchmark's baseline."""
    return tuple(sorted(devices, key=lambda device: natural_key(device.name)))


def ordered_devices(
    offers: Sequence[tuple[Device, DeviceOrigin]], policy_of_gpu: Mapping[str, PackingPolicy]
) -> tuple[Device, ...]:
    """The devices in publishing order. `policy_of_gpu`: by GPU UUID (binpack where missing);
    binpack GPUs come first, GPU after GPU, then the spread GPUs round-robin."""
    published: Mapping[str, list[MigProfile]] = defaultdict(list)
    for _, origin in offers:
        if isinstance(origin, DynamicMig) and origin.profile not in published[origin.gpu.uuid]:
            published[origin.gpu.uuid].append(origin.profile)

    def key(offer: tuple[Device, DeviceOrigin]) -> tuple[object, ...]:
        device, origin = offer
        gpu = origin.gpu
        packed = policy_of_gpu.get(gpu.uuid, "binpack") == "binpack"
        within = _within_gpu(origin, published[gpu.uuid], packed)
        name = natural_key(device.name)
        if packed:
            return (0, (gpu.minor, within), name)
        return (1, (within, gpu.minor), name)

    return tuple(device for device, _ in sorted(offers, key=key))
