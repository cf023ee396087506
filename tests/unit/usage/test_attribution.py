"""Who uses how much of which GPU: claims, pods and processes joined (pure)."""

import uuid

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import ClaimRecord, PreparedDevice
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.hardware.usage import DeviceUsage, ProcessUsage
from dra_driver.observability.usage_metrics import UsageMetrics
from dra_driver.usage.attribution import NO_POD, ClaimRow, DeviceFacts, DeviceUser, attribute, gpu_rows
from dra_driver.usage.facts import device_facts
from tests.support.nodes import simulated_node

GIB = 2**30
GPU = "GPU-0000"
WHOLE = DeviceFacts(0, GPU, "NVIDIA H100 80GB HBM3", (GPU, None), 80 * GIB, 1.0)
POOL = "node-a"


def record(
    name: str, device: str = "gpu-0", share: str | None = None, memory: int | None = None
) -> ClaimRecord:
    return ClaimRecord(
        claim=claim_ref("team", name, str(uuid.uuid5(uuid.NAMESPACE_OID, name))),
        devices=(
            PreparedDevice(
                ("r",),
                POOL,
                device,
                (f"k8s.x/claim={name}",),
                share_id=share,
                memory_limit_bytes=memory,
                cores_limit=None if memory is None else 25,
            ),
        ),
    )


def user(pod: str, claim: str, container: str = "main", share: str | None = None) -> DeviceUser:
    return DeviceUser("team", pod, container, claim, POOL, "gpu-0", share)


def gpu(*processes: ProcessUsage, utilization: float | None = 60.0) -> DeviceUsage:
    used = sum(p.memory_bytes or 0 for p in processes)
    return DeviceUsage(GPU, used, 80 * GIB, utilization, processes)


def test_a_claim_alone_on_its_gpu_gets_every_process_on_it_without_cgroups() -> None:
    rows = attribute(
        [record("solo")],
        {"gpu-0": WHOLE},
        [gpu(ProcessUsage(7, 3 * GIB), ProcessUsage(8, GIB))],
        [user("trainer", "solo")],
        {},
    )
    assert rows == (
        ClaimRow(
            "0", GPU, WHOLE.model, "gpu-0", "team", "trainer", "main", "solo", 80 * GIB, 1.0, 4 * GIB, 0.6
        ),
    )


def test_per_process_samples_win_over_the_device_figure() -> None:
    (row,) = attribute(
        [record("solo")],
        {"gpu-0": WHOLE},
        [gpu(ProcessUsage(7, GIB, 30.0), ProcessUsage(8, GIB, 12.5))],
        [user("trainer", "solo")],
        {},
    )
    assert row.utilization == 0.425


def test_vgpu_shares_are_told_apart_by_the_pods_of_their_processes() -> None:
    claims = [record("a", share="s-a", memory=8 * GIB), record("b", share="s-b", memory=4 * GIB)]
    usage = [gpu(ProcessUsage(1, 10 * GIB, 40.0), ProcessUsage(2, GIB, 15.0))]
    users = [user("pod-a", "a", share="s-a"), user("pod-b", "b", share="s-b")]
    rows = attribute(claims, {"gpu-0": WHOLE}, usage, users, {1: ("team", "pod-a"), 2: ("team", "pod-b")})
    by_claim = {row.claim: row for row in rows}
    assert (by_claim["a"].pod, by_claim["a"].memory_used_bytes, by_claim["a"].memory_limit_bytes) == (
        "pod-a",
        10 * GIB,
        8 * GIB,
    )
    assert (by_claim["b"].memory_used_bytes, by_claim["b"].utilization) == (GIB, 0.15)
    assert by_claim["a"].compute_limit == 0.25


def test_a_shared_gpu_whose_processes_cannot_be_placed_reports_limits_but_no_use() -> None:
    claims = [record("a", share="s-a", memory=8 * GIB), record("b", share="s-b", memory=4 * GIB)]
    rows = attribute(claims, {"gpu-0": WHOLE}, [gpu(ProcessUsage(1, GIB))], None, {})
    assert [(r.claim, r.pod, r.memory_used_bytes, r.utilization, r.memory_limit_bytes) for r in rows] == [
        ("a", "", None, None, 8 * GIB),
        ("b", "", None, None, 4 * GIB),
    ]


def test_gpu_rows_cover_every_gpu_but_not_mig_devices() -> None:
    mig = DeviceUsage(GPU, GIB, 10 * GIB, None, (), mig_uuid="MIG-1", mig_placement_start=0)
    rows = gpu_rows([gpu(utilization=None), mig], {GPU: (3, "H100")})
    assert [(r.gpu, r.model, r.utilization, r.memory_total_bytes) for r in rows] == [
        ("3", "H100", None, 80 * GIB)
    ]


def test_device_facts_give_mig_sizes_and_partition_limits() -> None:
    config = parse_node_config(
        yaml.safe_load("gpus:\n  - {index: 2, mode: mig-dynamic}\n  - {index: 4, mode: vgpu-capacity}\n"), "t"
    )
    inventory = node_inventory(simulated_node("mixed"), config)
    facts = device_facts(inventory)
    mig = facts["gpu-2-mig-1g10gb-3"]
    assert mig.usage_key[1] == 3
    assert 0 < mig.compute_limit < 1
    assert mig.memory_limit_bytes < facts["gpu-4"].memory_limit_bytes


def test_a_gpu_given_to_a_vm_is_measured_as_its_gpu_whole() -> None:
    """Mode vfio's kind has no case of its own in usage: it is its GPU whole (it raised before)."""
    config = parse_node_config(yaml.safe_load("gpus:\n  - {index: 1, mode: vfio}\n"), "t")
    gpus = simulated_node("l4x8")
    facts = device_facts(node_inventory(gpus, config))
    assert facts["gpu-1"].usage_key == (gpus[1].uuid, None)
    assert facts["gpu-1"].memory_limit_bytes == gpus[1].memory_bytes
    assert facts["gpu-1"].compute_limit == 1.0


def _series(registry: CollectorRegistry) -> set[tuple[str, str]]:
    return {
        (sample.name, sample.labels.get("claim", ""))
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name.startswith(("dra_driver_claim_", "dra_driver_gpu_"))
    }


def test_series_of_a_claim_that_went_are_removed() -> None:
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry)
    usage = [gpu(ProcessUsage(1, GIB, 10.0), ProcessUsage(2, GIB, 10.0))]
    pods = {1: ("team", "pod-a"), 2: ("team", "pod-b")}
    both = [record("a", share="s-a", memory=8 * GIB), record("b", share="s-b", memory=4 * GIB)]
    metrics.publish(gpu_rows(usage, {GPU: (0, "H100")}), attribute(both, {"gpu-0": WHOLE}, usage, None, pods))
    assert ("dra_driver_claim_memory_limit_bytes", "b") in _series(registry)

    metrics.publish(
        gpu_rows(usage, {GPU: (0, "H100")}), attribute(both[:1], {"gpu-0": WHOLE}, usage, None, pods)
    )
    left = _series(registry)
    assert not any(claim == "b" for _name, claim in left)
    assert ("dra_driver_claim_memory_limit_bytes", "a") in left
    assert ("dra_driver_gpu_memory_used_bytes", "") in left


def test_a_host_process_on_a_shared_gpu_counts_for_no_claim() -> None:
    claims = [record("a", share="s-a", memory=8 * GIB), record("b", share="s-b", memory=4 * GIB)]
    usage = [gpu(ProcessUsage(1, 2 * GIB, 10.0), ProcessUsage(9, GIB, 5.0))]
    users = [user("pod-a", "a", share="s-a"), user("pod-b", "b", share="s-b")]
    rows = attribute(claims, {"gpu-0": WHOLE}, usage, users, {1: ("team", "pod-a"), 9: NO_POD})
    assert {r.claim: (r.memory_used_bytes, r.utilization) for r in rows} == {
        "a": (2 * GIB, 0.1),
        "b": (0, 0.0),
    }
