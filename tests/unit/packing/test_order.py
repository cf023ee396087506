"""The published order: first fit packs GPU after GPU (binpack) or round-robin (spread), and
names stay what they were."""

import yaml
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.naming import parse_device_name
from dra_driver.devices.node_config import GpuSettings, NodeConfig, VgpuPartitionSize
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.devices.order import name_ordered, orphaned_slices
from dra_driver.devices.origins import DynamicMig
from dra_driver.devices.slices import plan_slices
from dra_driver.packing.allocator import Allocation, Claim, NodeState, Pool, Request
from tests.support.nodes import simulated_node
from tests.support.packing.traces import GIB, mig_shapes

DRIVER = "gpu.example.com"


def mig_inventory(packing: str = "binpack") -> Inventory:
    text = f"default: {{mode: mig-dynamic, packing: {packing}}}"
    return node_inventory(simulated_node("dgx-h100-mig"), parse_node_config(yaml.safe_load(text), "t"))


def first_fits(inventory: Inventory, claims: list[Claim]) -> list[str]:
    state = NodeState(Pool.from_inventory(inventory, DRIVER))
    names = []
    for claim in claims:
        answer = state.allocate(claim)
        assert isinstance(answer, Allocation), answer
        state.add(answer)
        names.append(answer.devices[0])
    return names


def test_reordering_keeps_every_name_and_names_parse_back() -> None:
    for packing in ("binpack", "spread"):
        inventory = mig_inventory(packing)
        assert name_ordered(inventory.devices) == name_ordered(mig_inventory("binpack").devices)
        assert all(parse_device_name(device.name) is not None for device in inventory.devices)


def test_binpack_puts_small_mig_instances_where_they_block_the_big_profiles_least() -> None:
    """Name order puts the first 1g at slice 0, which blocks the only 4g placement and a 3g
    one; binpack starts in the right half (slice 5; slice 6 would orphan slice 7), so 4g and
    3g at slice 0 stay possible."""
    inventory = mig_inventory()
    one_g = mig_shapes(simulated_node("dgx-h100-mig")[0])["1g"].claim
    (first,) = first_fits(inventory, [one_g])
    origin = inventory.origin_of_device[first]
    assert isinstance(origin, DynamicMig)
    assert (origin.gpu.minor, origin.placement.start) == (0, 5)
    (by_name,) = first_fits(replace(inventory, devices=name_ordered(inventory.devices)), [one_g])
    assert by_name == "gpu-0-mig-1g10gb-0"
    four_g = mig_shapes(simulated_node("dgx-h100-mig")[0])["4g"].claim
    assert first_fits(inventory, [one_g, four_g])[1] == "gpu-0-mig-4g40gb-0"


def test_a_1g_takes_slice_6_last_because_it_orphans_slice_7() -> None:
    """Only the 1g.20gb at 6, the 3g at 4 and the 7g reach memory slice 7; a 1g at 6 blocks all
    three, so the slice is lost while it runs. Found by the order search (docs/drafts/packing2.md):
    1g at 5, 4, 3, 2, 1, 0, then 6."""
    gpu = simulated_node("dgx-h100-mig")[0]
    one_g = gpu.mig_profiles[0]
    assert one_g.name == "1g.10gb"
    orphans = {
        placement.start: orphaned_slices(placement, gpu.mig_profiles) for placement in one_g.placements
    }
    assert orphans == {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 1}
    # With only 1g.10gb published, nothing reaches slice 7 in the first place: nothing to orphan.
    assert orphaned_slices(one_g.placements[6], [one_g]) == 0
    placed = first_fits(mig_inventory(), [mig_shapes(gpu)["1g"].claim] * 7)
    starts = [inventory_start(name) for name in placed]
    assert starts == [5, 4, 3, 2, 1, 0, 6]
    # Spread leaves orphans out (each GPU holds few tenants there; the 1g at 5 would block the
    # 2g and 1g.20gb at 4 on every GPU): slice 6 first on each GPU, as before.
    spread = first_fits(mig_inventory("spread"), [mig_shapes(gpu)["1g"].claim] * 9)
    assert [inventory_start(name) for name in spread] == [6] * 8 + [5]


def test_ten_1g_then_two_3g_leave_the_second_gpu_usable() -> None:
    """The planner's example (10x1g.10gb, 2x3g.40gb on a DGX H100): with the 1g at slice 6
    first, the second GPU held 1g at 4-6 and a 3g at 0-3, and its slice 7 was stranded; now the
    3 1g sit at 3-5 and both 3g go to the third GPU, so only the full GPU's slice 7 is left."""
    gpu = simulated_node("dgx-h100-mig")[0]
    shapes = mig_shapes(gpu)
    placed = first_fits(mig_inventory(), [shapes["1g"].claim] * 10 + [shapes["3g"].claim] * 2)
    second_gpu = sorted(inventory_start(name) for name in placed[7:10])
    assert second_gpu == [3, 4, 5]
    assert [name.split("-mig-")[0] for name in placed[10:]] == ["gpu-2", "gpu-2"]


def inventory_start(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def test_binpack_fills_one_gpu_before_the_next_and_spread_goes_round_robin() -> None:
    one_g = mig_shapes(simulated_node("dgx-h100-mig")[0])["1g"].claim
    packed = first_fits(mig_inventory(), [one_g] * 8)
    assert [name.split("-mig-")[0] for name in packed] == ["gpu-0"] * 7 + ["gpu-1"]
    spread = first_fits(mig_inventory("spread"), [one_g] * 8)
    assert [name.split("-mig-")[0] for name in spread] == [f"gpu-{minor}" for minor in range(8)]


def test_a_gpu_with_a_tenant_is_skipped_by_spread_until_every_gpu_has_one() -> None:
    gpus = simulated_node("dgx-h100")
    settings = GpuSettings(
        mode="vgpu-partitions", partitions=(VgpuPartitionSize(10 * GIB),), packing="spread"
    )
    inventory = node_inventory(gpus, NodeConfig(default=settings))
    share = Claim((Request("vgpu", selector=lambda d: d.type == "vgpu"),))
    placed = first_fits(inventory, [share] * 9)
    assert [inventory.gpu_of_device[name].minor for name in placed] == [*range(8), 0]


def test_kubernetes_1_34_keeps_each_gpus_devices_in_its_own_slice_so_spread_is_gpu_after_gpu() -> None:
    """1.34 slices hold a counter set with the devices drawing from it, one slice per GPU: the
    scheduler then tries GPU after GPU whatever the inventory order, as docs/drafts/packing.md says."""
    inventory = mig_inventory("spread")
    slices = plan_slices(inventory, "1.34")
    gpus_per_slice = [{inventory.gpu_of_device[d.name].minor for d in planned.devices} for planned in slices]
    assert gpus_per_slice == [{minor} for minor in range(8)]
    one_g = mig_shapes(simulated_node("dgx-h100-mig")[0])["1g"].claim
    state = NodeState(Pool.from_slices(slices, DRIVER))
    first = state.allocate(one_g)
    assert isinstance(first, Allocation)
    state.add(first)
    assert devices_gpu(state.allocate(one_g)) == 0


def devices_gpu(answer: Allocation | object) -> int:
    assert isinstance(answer, Allocation)
    return int(answer.devices[0].split("-")[1])
