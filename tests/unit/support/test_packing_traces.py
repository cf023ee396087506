"""Traces are reproducible and churn; the replay counts refusals the way the metrics say."""

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.packing.allocator import NodeState, Pool
from tests.support.nodes import simulated_node
from tests.support.packing.bound import BestFit, RepackingPacker
from tests.support.packing.simulate import replay, replay_repacking
from tests.support.packing.traces import capacity_mix, make_trace, mig_mix


def test_a_seed_gives_the_same_trace_and_another_seed_another() -> None:
    gpu = simulated_node("dgx-h100")[0]
    first = make_trace(capacity_mix(gpu), 8 * gpu.memory_bytes, 200, seed=7)
    assert first == make_trace(capacity_mix(gpu), 8 * gpu.memory_bytes, 200, seed=7)
    assert first != make_trace(capacity_mix(gpu), 8 * gpu.memory_bytes, 200, seed=8)
    arrivals = [event for event in first if event.shape is not None]
    departures = [event for event in first if event.shape is None]
    assert len(arrivals) == len(departures) == 200
    assert [event.hours for event in first] == sorted(event.hours for event in first)
    departure_of = {event.claim_id: event.hours for event in departures}
    assert all(departure_of[event.claim_id] > event.hours for event in arrivals)


def test_an_overloaded_node_refuses_and_the_repacking_packer_never_strands() -> None:
    gpus = simulated_node("dgx-h100-mig")[:1]
    inventory = node_inventory(gpus, NodeConfig(default=GpuSettings(mode="mig-dynamic")))
    pool = Pool.from_inventory(inventory, "gpu.example.com")
    events = make_trace(mig_mix(gpus[0]), gpus[0].memory_bytes, 150, seed=3, load=1.5)
    first_fit = replay(NodeState(pool), events, gpus[0].memory_bytes)
    assert first_fit.arrivals == 150
    assert 0 < first_fit.refused < 150
    assert first_fit.memory_at_first_refusal is not None and 0 < first_fit.memory_at_first_refusal <= 1
    assert 0 < first_fit.utilisation <= 1
    best_fit = replay(NodeState(pool), events, gpus[0].memory_bytes, BestFit(inventory))
    assert best_fit.arrivals == 150
    repacked = replay_repacking(RepackingPacker(NodeState(pool), False), events, gpus[0].memory_bytes)
    assert repacked.fragmented == 0 and repacked.refused > 0
