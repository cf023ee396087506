"""How the cluster benchmark asks each fleet for a trace's needs, and the fleets it builds."""

from collections import Counter

import pytest

from dra_driver import DEFAULT_DRIVER_NAME as D
from dra_driver.devices import attributes as names
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.packing.shapes import parse_shape
from tests.bench.cluster_scale.fleet import fleet_mode, fleet_nodes, partition_sizes, representative_gpu
from tests.bench.cluster_scale.needs import GIB, Need, need_for

H100 = simulated_gpus("n", resolve_node_spec("dgx-h100"))[0]


def _need(kind: str, mode: str) -> Need:
    return need_for(parse_shape(kind, kind), mode, H100)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "mode", "expected"),
    [
        ("gpu:8", "gpu", Need("gpu", count=8)),
        ("1g.10gb", "gpu", Need("gpu")),
        ("vgpu:40Gi/50%", "gpu", Need("gpu")),
        ("gpu:2", "mig-dynamic", Need("mig", count=2, profile="7g.80gb")),
        # 1g.10gb holds 9.75 GiB: a 10 GiB share needs the 1g.20gb profile.
        ("vgpu:10Gi/15%", "mig-dynamic", Need("mig", profile="1g.20gb")),
        ("vgpu:20Gi/30%", "mig-dynamic", Need("mig", profile="3g.40gb")),
        ("3g.40gb", "mig-dynamic", Need("mig", profile="3g.40gb")),
        ("1g.10gb", "vgpu-capacity", Need("vgpu", memory_bytes=10 * GIB, cores=15)),
        # 80 GiB is more than the GPU's full profile holds: the profile's own memory.
        (
            "7g.80gb",
            "vgpu-capacity",
            Need("vgpu", memory_bytes=H100.mig_profiles[-1].memory_bytes, cores=100),
        ),
        ("gpu:2", "vgpu-capacity", Need("vgpu", count=2)),
        ("gpu:2", "vgpu-partitions", Need("gpu", count=2)),
        ("1g.10gb", "native", Need("mig", profile="1g.10gb")),
        ("vgpu:10Gi/15%", "native", Need("vgpu", memory_bytes=10 * GIB, cores=15)),
    ],
)
def test_each_mode_asks_for_a_need_the_way_it_can_serve_it(kind: str, mode: str, expected: Need) -> None:
    assert _need(kind, mode) == expected


def test_a_need_is_the_same_question_to_the_api_and_to_the_model() -> None:
    need = Need("vgpu", memory_bytes=10 * GIB, cores=15)
    assert need.api_request(D) == {
        "deviceClassName": f"vgpu.{D.removeprefix('gpu.')}",
        "count": 1,
        "capacity": {"requests": {"memory": "10Gi", "cores": "15"}},
    }
    (request,) = need.model_claim().requests
    assert (request.count, dict(request.capacity)) == (1, {"memory": 10 * GIB, "cores": 15})
    mig = Need("mig", count=2, profile="1g.10gb")
    assert mig.api_request(D)["selectors"] == [
        {"cel": {"expression": f'device.attributes["{D}"].{names.PROFILE} == "1g.10gb"'}}
    ]
    assert mig.model_claim().requests[0].count == 2
    assert mig.label == "2x1g.10gb" and need.label == "vgpu:10Gi/15%" and Need("gpu", 8).label == "gpu:8"


def test_a_mixed_fleet_splits_its_nodes_by_share_and_asks_as_written() -> None:
    needs = [Need("vgpu", memory_bytes=10 * GIB, cores=15), Need("vgpu", memory_bytes=10 * GIB, cores=20)]
    nodes = fleet_nodes("mixed", 10, "binpack", needs)
    assert Counter((node.profile, node.mode) for node in nodes) == {
        ("dgx-h100", "mig-dynamic"): 4,
        ("dgx-a100-80gb", "vgpu-partitions"): 3,
        ("b200x8", "gpu"): 3,
    }
    assert len({node.name for node in nodes}) == 10
    types = {
        node.mode: Counter(str(d.attributes[names.TYPE]) for d in node.inventory.devices) for node in nodes
    }
    assert set(types["mig-dynamic"]) == {"mig"} and types["gpu"] == {"gpu": 8}
    # One partition size with the most cores asked at it (20 %), so five to a GPU, not eight,
    # beside each A100's whole-GPU device.
    assert types["vgpu-partitions"]["gpu"] == 8 and types["vgpu-partitions"]["vgpu"] == 8 * 5
    assert partition_sizes(needs)[0].cores == 20
    assert fleet_mode("mixed") == "native" and representative_gpu("mixed") is None
    assert fleet_mode("mig-dynamic") == "mig-dynamic"
    gpu = representative_gpu("whole")
    assert gpu is not None and gpu.product_name == H100.product_name
