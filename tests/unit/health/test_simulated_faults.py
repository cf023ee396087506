"""Faults handed to a running agent's simulated GPUs through its inbox."""

from pathlib import Path

import pytest

from dra_driver.hardware.simulated import SimulatedBackend, SimulatedEvent
from dra_driver.hardware.simulated_nodes import resolve_node_spec
from dra_driver.health.simulated_faults import (
    GPUS_FILE,
    FaultError,
    SimulatedFault,
    apply_pending_faults,
    inbox,
    open_inbox,
    submit_fault,
)


async def backend() -> tuple[SimulatedBackend, dict[str, str]]:
    hardware = SimulatedBackend("node-a", resolve_node_spec("t4x4"))
    gpus = await hardware.discover()
    return hardware, {str(gpu.index): gpu.uuid for gpu in gpus}


async def test_faults_are_applied_in_order_by_index_or_uuid_and_removed(tmp_path: Path) -> None:
    hardware, gpus = await backend()
    open_inbox(tmp_path, gpus)
    submit_fault(tmp_path, SimulatedFault(gpu="1", kind="xid", xid=48))
    submit_fault(tmp_path, SimulatedFault(gpu=gpus["2"], kind="lost"))

    assert apply_pending_faults(tmp_path, hardware, gpus) == 2

    assert hardware.take_events() == (SimulatedEvent(gpus["1"], 48), SimulatedEvent(gpus["2"], 79))
    assert list(inbox(tmp_path).iterdir()) == [inbox(tmp_path) / GPUS_FILE]  # the GPU list stays
    assert apply_pending_faults(tmp_path, hardware, gpus) == 0


async def test_a_bad_fault_is_refused_and_does_not_block_the_others(tmp_path: Path) -> None:
    hardware, gpus = await backend()
    open_inbox(tmp_path, gpus)
    (inbox(tmp_path) / "0-bad.json").write_text('{"gpu": "9", "kind": "xid", "xid": 48}')
    (inbox(tmp_path) / "1-worse.json").write_text("not json")
    (inbox(tmp_path) / "2-typo.json").write_text('{"gpu": "1", "kind": "xid", "xdi": 48}')
    (inbox(tmp_path) / "3-no-xid.json").write_text('{"gpu": "1", "kind": "xid"}')
    (inbox(tmp_path) / "4-kind.json").write_text('{"gpu": "1", "kind": "melted"}')
    submit_fault(tmp_path, SimulatedFault(gpu="0", kind="xid", xid=79))

    assert apply_pending_faults(tmp_path, hardware, gpus) == 1
    assert hardware.take_events() == (SimulatedEvent(gpus["0"], 79),)
    assert list(inbox(tmp_path).iterdir()) == [inbox(tmp_path) / GPUS_FILE]


def test_an_xid_out_of_range_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(FaultError, match="--xid: 0 is not an XID"):
        submit_fault(tmp_path, SimulatedFault(gpu="0", kind="xid", xid=0))
    assert not inbox(tmp_path).exists()


async def test_a_gpu_the_agent_did_not_list_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    _, gpus = await backend()
    open_inbox(tmp_path, gpus)

    with pytest.raises(FaultError, match=r"^--gpu no GPU 'GPU-nope' on this node; GPUs: 0 \(GPU-"):
        submit_fault(tmp_path, SimulatedFault(gpu="GPU-nope", kind="lost"))
    assert list(inbox(tmp_path).iterdir()) == [inbox(tmp_path) / GPUS_FILE]
