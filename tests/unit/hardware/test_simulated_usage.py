"""The simulated node's GPU usage: idle unless a usage file says what runs where."""

import json
from pathlib import Path

import pytest

from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.simulated_usage import SimulatedUsageReader, usage_from_json
from tests.support.nodes import simulated_node

GIB = 2**30


def test_an_idle_node_reports_every_gpu_and_mig_device() -> None:
    gpus = simulated_node("mixed")
    usage = usage_from_json(gpus, {})
    assert len(usage) == len(gpus) + sum(len(gpu.mig_instances) for gpu in gpus)
    assert all(u.memory_used_bytes == 0 and not u.processes for u in usage)
    assert {u.utilization_percent for u in usage if u.mig_uuid} == {None}


def test_processes_set_memory_used_and_utilisation(tmp_path: Path) -> None:
    gpus = simulated_node("mixed")
    mig = next(instance for gpu in gpus for instance in gpu.mig_instances)
    usage_file = tmp_path / "usage.json"
    usage_file.write_text(
        json.dumps(
            {
                gpus[6].uuid: {
                    "utilization": 35,
                    "processes": [{"pid": 7, "memoryBytes": 2 * GIB, "smPercent": 30}],
                },
                mig.uuid: {"processes": [{"pid": 8, "memoryBytes": GIB}]},
            }
        )
    )
    usage = {u.mig_uuid or u.gpu_uuid: u for u in SimulatedUsageReader(lambda: gpus, usage_file).read_usage()}
    assert (usage[gpus[6].uuid].memory_used_bytes, usage[gpus[6].uuid].utilization_percent) == (2 * GIB, 35.0)
    assert usage[gpus[6].uuid].processes[0].sm_percent == 30.0
    assert usage[mig.uuid].memory_used_bytes == GIB
    assert usage[mig.uuid].mig_placement_start == mig.placement.start


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"GPU-nope": {}}, "no GPU or MIG device GPU-nope on this node"),
        ("text", "expected an object keyed by GPU or MIG UUID"),
    ],
)
def test_a_bad_usage_file_is_one_clear_error(data: object, message: str) -> None:
    with pytest.raises(HardwareError, match=message):
        usage_from_json(simulated_node("mixed"), data)


def test_a_bad_process_entry_names_its_field() -> None:
    gpus = simulated_node("mixed")
    with pytest.raises(
        HardwareError, match=rf"{gpus[0].uuid}.processes\[0\].memoryBytes: expected a non-negative"
    ):
        usage_from_json(gpus, {gpus[0].uuid: {"processes": [{"pid": 1, "memoryBytes": -1}]}})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"utilization": "40"}, r'\.utilization: expected a non-negative number, got the string "40"$'),
        ({"utilization": -1}, r"\.utilization: expected a non-negative number, got the integer -1$"),
        ({"processes": [{"memoryBytes": 1}]}, r"\.processes\[0\]\.pid: required$"),
        ({"utilisation": 40}, r"\.utilisation: unknown field \(allowed here: utilization, processes\)$"),
    ],
)
def test_a_device_entry_is_decoded_in_the_house_wording(entry: object, message: str) -> None:
    gpus = simulated_node("mixed")
    with pytest.raises(HardwareError, match=rf"^simulated usage {gpus[0].uuid}{message}"):
        usage_from_json(gpus, {gpus[0].uuid: entry})
