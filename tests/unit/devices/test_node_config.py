"""The node configuration: strict decoding, and errors that name the GPU and the setting."""

from pathlib import Path

import pytest
import yaml
from msgspec.structs import replace

from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.gpu_selection import catalog_model
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import NodeConfigError, NodePlan, VgpuPartitionSize, plan_gpus, plan_node
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.devices.vgpu import MPS_CLIENTS_PER_GPU, partition_slots
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import MigMode
from dra_driver.hardware.simulated_nodes import GpuGroupSpec, SimulatedNodeSpec, simulated_gpus
from tests.support.nodes import GIB, simulated_node


def plan(profile: str, text: str) -> list[str]:
    config = parse_node_config(yaml.safe_load(text), "test config")
    return [p.mode for p in plan_gpus(config, simulated_node(profile))]


def test_without_a_file_gpus_are_whole_and_mig_gpus_offer_their_instances() -> None:
    modes = plan("mixed", "")
    gpus = simulated_node("mixed")
    assert modes == ["mig-static" if gpu.mig_mode.value == "enabled" else "gpu" for gpu in gpus]


def test_gpus_are_picked_by_index_or_uuid_and_the_rest_follow_the_default() -> None:
    gpus = simulated_node("l4x8")
    text = f"""
default: {{mode: vgpu-capacity}}
gpus:
  - {{index: 0, mode: gpu}}
  - {{uuid: {gpus[1].uuid}, mode: vgpu-partitions, vgpu: {{partitions: [{{memory: 4Gi}}]}}}}
"""
    assert plan("l4x8", text) == ["gpu", "vgpu-partitions", *["vgpu-capacity"] * 6]


@pytest.mark.parametrize(
    ("profile", "text", "message"),
    [
        (
            "l4x8",
            "gpus: [{index: 9, mode: gpu}]",
            "gpus[0]: no GPU with index 9 on this node; GPUs present: 0 (",
        ),
        ("l4x8", "gpus: [{uuid: GPU-nope, mode: gpu}]", "gpus[0]: no GPU with uuid GPU-nope on this node"),
        (
            "l4x8",
            "gpus: [{index: 2, mode: mig-dynamic}]",
            "gpus[0].mode: mig-dynamic on GPU 2 (NVIDIA L4, GPU-",
        ),
        ("l4x8", "gpus: [{index: 2, mode: mig-static}]", "this GPU does not support MIG"),
        (
            "dgx-h100",
            "gpus: [{index: 1, mode: mig-dynamic}]",
            "MIG mode is disabled on this GPU; enable it first (nvidia-smi -i 1 -mig 1)",
        ),
        (
            "dgx-h100-mig",
            "default: {mode: vgpu-capacity}",
            "default.mode: vgpu-capacity on GPU 0 (NVIDIA H100 80GB HBM3, GPU-",
        ),
        (
            "l4x8",
            "gpus: [{index: 3, mode: vgpu-partitions, vgpu: {partitions: [{memory: 40Gi}]}}]",
            "gpus[0].vgpu.partitions[0].memory: 40960Mi does not fit GPU 3 (NVIDIA L4",
        ),
        (
            "l4x8",
            "default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: 4Gi}, {memory: 4096Mi}]}}",
            "default.vgpu.partitions[1].memory: two partition sizes with the same memory on GPU 0",
        ),
        (
            "dgx-h100-mig",
            "gpus: [{index: 0, mode: mig-dynamic, mig: {profiles: [1g.10gb, 9g.99gb]}}]",
            "gpus[0].mig.profiles: ['9g.99gb'] not offered by GPU 0",
        ),
        (
            "l4x8",
            "default: {mode: vgpu-capacity, vgpu: {memoryStep: 64Gi}}",
            "default.vgpu.memoryStep: 65536Mi is more",
        ),
    ],
)
def test_a_config_that_does_not_fit_the_gpus_names_the_gpu_and_the_setting(
    profile: str, text: str, message: str
) -> None:
    with pytest.raises(NodeConfigError) as caught:
        plan(profile, text)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- gpu", "test config: node config: expected an object with fields default, gpus, got a list"),
        ("gpu: []", "gpu: unknown field (allowed here: default, gpus)"),
        ("default: {mode: whole}", 'default.mode: "whole" is not one of auto, gpu, mig-static, mig-dynamic'),
        ("gpus: [{mode: gpu}]", "gpus[0]: set exactly one of 'index', 'uuid', 'model' or 'productName'"),
        ("gpus: [{index: 0, uuid: GPU-x}]", "this is for, got ['index', 'uuid']"),
        ("gpus: [{model: L4, productName: NVIDIA L4}]", "this is for, got ['model', 'productName']"),
        ("gpus: [{model: A100}]", "gpus[0].model: 'A100' is not a GPU model of the catalog; known: A100-"),
        ("gpus: [{productName: ' '}]", "gpus[0].productName: expected the GPU's name as nvidia-smi shows it"),
        ("gpus: [{productName: 7}]", "gpus[0].productName: expected the GPU's name"),
        ("gpus: [{index: -1}]", "gpus[0].index: expected a GPU index (an integer ≥ 0), got the integer -1"),
        ("gpus: [{index: true}]", "gpus[0].index: expected a GPU index"),
        (
            "gpus: [{index: null, uuid: GPU-a}]",
            "gpus[0].index: expected a GPU index (an integer ≥ 0), got null",
        ),
        ("gpus: {index: 0}", "gpus: expected a list"),
        (
            "default: {mode: gpu, vgpu: {memoryStep: 1Gi}}",
            "default.vgpu: only allowed with mode vgpu-capacity",
        ),
        ("default: {mode: gpu, mig: {profiles: []}}", "default.mig: only allowed with mode mig-dynamic"),
        ("default: {mode: gpu, vgpu: {}}", "default.vgpu: only allowed with mode vgpu-capacity"),
        (
            "default: {mode: vgpu-partitions}",
            "default.vgpu.partitions: mode vgpu-partitions needs at least one",
        ),
        (
            "default: {mode: vgpu-capacity, vgpu: {partitions: [{memory: 1Gi}]}}",
            "default.vgpu.partitions: only allowed with mode vgpu-partitions",
        ),
        (
            "default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: ten}]}}",
            "default.vgpu.partitions[0].memory: expected a whole number of bytes such as 10Gi",
        ),
        (
            "default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: 1000}]}}",
            "default.vgpu.partitions[0].memory: must be a positive whole number of MiB",
        ),
        (
            "default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: 1Gi, cores: 101}]}}",
            "default.vgpu.partitions[0].cores: 101 is out of range; expected an integer percentage from 1 to",
        ),
        (
            "default: {mode: vgpu-partitions, vgpu: {partitions: [{cores: 10}]}}",
            "default.vgpu.partitions[0].memory: required",
        ),
        (
            "default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: 1Gi, size: 2}]}}",
            "default.vgpu.partitions[0].size: unknown field (allowed here: memory, cores)",
        ),
        (
            "default: {mode: vgpu-capacity, vgpu: {memoryStep: 512Ki}}",
            "default.vgpu.memoryStep: must be a positive",
        ),
        (
            "default: {mode: mig-dynamic, mig: {profiles: [7]}}",
            "default.mig.profiles[0]: expected a MIG profile name such as 1g.10gb, got the integer 7",
        ),
        (
            "default: {mode: vgpu-capacity, vgpu: {enforcement: hami}}",
            'default.vgpu.enforcement: "hami" is not one of mps, hami-core, none',
        ),
        (
            "gpus: [{index: 0, mode: vgpu-partitions, vgpu: {partitions: [{memory: 1Gi}], enforcement: 1}}]",
            "gpus[0].vgpu.enforcement: expected one of mps, hami-core, none, got",
        ),
        (
            "default: {mode: mig-dynamic, packing: tight}",
            'default.packing: "tight" is not one of binpack, spread',
        ),
        (
            "gpus: [{index: 0, mode: vgpu-capacity, packing: spread}]",
            "gpus[0].packing: spread needs a device per tenant slot",
        ),
    ],
)
def test_malformed_configs_are_rejected_with_the_field_path(text: str, message: str) -> None:
    with pytest.raises(NodeConfigError) as caught:
        parse_node_config(yaml.safe_load(text), "test config")
    assert message in str(caught.value)
    assert str(caught.value).startswith("test config: ")


def test_the_file_is_read_from_disk_and_bad_files_are_reported(tmp_path: Path) -> None:
    good = tmp_path / "node.yaml"
    good.write_text("default: {mode: vgpu-capacity}\n")
    inventory = node_inventory(simulated_node("t4x4"), load_node_config(good))
    assert {device.type for device in inventory.devices} == {"vgpu"}

    broken = tmp_path / "broken.yaml"
    broken.write_text("default: [\n")
    with pytest.raises(NodeConfigError, match=f"node config {broken}: not valid YAML"):
        load_node_config(broken)
    with pytest.raises(NodeConfigError, match="cannot read it"):
        load_node_config(tmp_path / "missing.yaml")


# -- model and productName entries: one file for a mixed fleet -------------------------------------

FLEET_CONFIG = """
default: {mode: auto}
gpus:
  - {model: L4, mode: vgpu-capacity}
  - {productName: NVIDIA A100-SXM4-80GB, mode: mig-dynamic}
  - {model: H100-SXM5-80GB, mode: gpu}
"""


def node_plan(profile: str, text: str) -> NodePlan:
    return plan_node(parse_node_config(yaml.safe_load(text), "test config"), simulated_node(profile))


def test_one_file_configures_each_kind_of_node_by_model_and_product_name() -> None:
    assert [p.mode for p in node_plan("l4x8", FLEET_CONFIG).plans] == ["vgpu-capacity"] * 8
    assert [p.mode for p in node_plan("dgx-h100", FLEET_CONFIG).plans] == ["gpu"] * 8
    # The mixed node: the productName entry applies to its A100s (GPUs 4 and 5 have MIG off, so
    # they are left out), the model entry to its L4s.
    mixed = node_plan("mixed", FLEET_CONFIG)
    assert {p.gpu.index: p.mode for p in mixed.plans} == {
        **dict.fromkeys((0, 1, 2, 3), "mig-dynamic"),
        6: "vgpu-capacity",
        7: "vgpu-capacity",
    }
    assert [problem.gpu.index for problem in mixed.problems if problem.gpu] == [4, 5]


def test_index_and_uuid_entries_win_over_model_entries_which_win_over_the_default() -> None:
    gpus = simulated_node("l4x8")
    text = f"""
default: {{mode: vgpu-capacity}}
gpus:
  - {{model: L4, mode: gpu}}
  - {{index: 1, mode: vgpu-partitions, vgpu: {{partitions: [{{memory: 4Gi}}]}}}}
  - {{uuid: {gpus[2].uuid}, mode: vgpu-capacity}}
"""
    result = node_plan("l4x8", text)
    assert result.problems == ()
    assert [p.mode for p in result.plans] == ["gpu", "vgpu-partitions", "vgpu-capacity", *["gpu"] * 5]


def test_every_catalog_model_is_recognised_on_its_simulated_gpu() -> None:
    for key, model in gpu_models().items():
        group = GpuGroupSpec(model, 1, MigMode.DISABLED if model.mig else MigMode.UNSUPPORTED)
        (gpu,) = simulated_gpus("n", SimulatedNodeSpec("test", (group,)))
        assert catalog_model(gpu) == key
    assert catalog_model(replace(simulated_node("l4x8")[0], product_name="NVIDIA Future GPU")) is None


def test_a_gpu_that_does_not_fit_is_left_out_and_the_others_are_planned() -> None:
    result = node_plan("mixed", "gpus: [{model: A100-SXM4-80GB, mode: mig-dynamic}]")
    gpus = simulated_node("mixed")
    # GPUs 4 and 5 have MIG mode off: left out, each with a problem naming it and the setting.
    assert [p.gpu.index for p in result.plans] == [0, 1, 2, 3, 6, 7]
    assert [(p.gpu, p.setting) for p in result.problems] == [
        (gpus[4], "gpus[0].mode"),
        (gpus[5], "gpus[0].mode"),
    ]
    assert result.problems[0].message.startswith(
        f"gpus[0].mode: mig-dynamic on GPU 4 (NVIDIA A100-SXM4-80GB, {gpus[4].uuid}): MIG mode is disabled"
    )


def test_a_model_entry_that_matches_nothing_is_fine_but_an_index_entry_is_a_problem() -> None:
    fine = node_plan("t4x4", "gpus: [{model: L4, mode: mig-dynamic}]")
    assert fine.problems == () and len(fine.plans) == 4
    unmatched = node_plan("t4x4", "gpus: [{index: 7, mode: gpu}]")
    assert len(unmatched.plans) == 4  # nothing is offered in a mode nobody asked for: all default
    (problem,) = unmatched.problems
    assert (problem.gpu, problem.setting) == (None, "gpus[0].index")
    assert problem.message.startswith("gpus[0]: no GPU with index 7 on this node")


def test_an_index_and_a_uuid_entry_for_one_gpu_leave_it_out() -> None:
    """Only the node can tell that an index and a uuid name the same GPU; the rest go on."""
    gpu = simulated_node("l4x8")[3]
    text = f"gpus: [{{index: 3, mode: gpu}}, {{uuid: {gpu.uuid}, mode: vgpu-capacity}}]"
    result = node_plan("l4x8", text)
    assert len(result.plans) == 7
    assert [problem.setting for problem in result.problems] == ["gpus[1]"]
    assert "GPU 3 (NVIDIA L4" in result.problems[0].message
    assert result.problems[0].message.endswith("is already configured by gpus[0]")


DUPLICATES = {
    "the same index": ("{index: 0, mode: gpu}", "{index: 0, mode: vgpu-capacity}", "index 0"),
    "the same uuid": ("{uuid: GPU-a, mode: gpu}", "{uuid: GPU-a}", "uuid GPU-a"),
    "the same model": ("{model: L4}", "{model: L4, mode: gpu}", "model L4"),
    "the same productName": (
        "{productName: NVIDIA L4}",
        "{productName: NVIDIA L4}",
        "productName 'NVIDIA L4'",
    ),
    "a model, then its product name": ("{model: L4}", "{productName: NVIDIA L4}", "model L4"),
    "a product name, then its model": ("{productName: NVIDIA L4}", "{model: L4}", "productName 'NVIDIA L4'"),
}


@pytest.mark.parametrize(("first", "second", "selector"), DUPLICATES.values(), ids=DUPLICATES.keys())
def test_two_entries_that_select_the_same_gpus_are_refused_without_a_node(
    first: str, second: str, selector: str
) -> None:
    """Equal rank, so on any node with such a GPU neither could win: a mistake of the file."""
    with pytest.raises(NodeConfigError) as caught:
        parse_node_config(yaml.safe_load(f"gpus: [{first}, {{index: 5}}, {second}]"), "f.yaml")
    assert caught.value.problems == (
        f"f.yaml: gpus[2]: selects the same GPUs as gpus[0] ({selector}); "
        "give each GPU or kind of GPU one entry",
    )


def test_entries_that_select_different_gpus_are_no_duplicates() -> None:
    entries = ["index: 0", "index: 1", "uuid: GPU-a", "uuid: GPU-b", "model: L4", "model: T4"]
    entries.append("productName: x")
    text = "gpus: [" + ", ".join(f"{{{entry}}}" for entry in entries) + "]"
    assert len(parse_node_config(yaml.safe_load(text), "f.yaml").gpus) == 7


def test_every_malformed_part_of_a_file_is_reported_at_once() -> None:
    text = "default: {mode: whole}\ngpus: [{index: 0, mode: gpu}, {model: nope}, {index: 1, mode: odd}]"
    with pytest.raises(NodeConfigError) as caught:
        parse_node_config(yaml.safe_load(text), "f.yaml")
    assert [line.split(":")[1].strip() for line in caught.value.problems] == [
        "default.mode",
        "gpus[1].model",
        "gpus[2].mode",
    ]
    assert all(line.startswith("f.yaml: ") for line in str(caught.value).splitlines())


def test_every_wrong_field_of_every_entry_is_its_own_line() -> None:
    text = (
        "gpus: [{index: -1, mode: odd}, {model: nope, packing: tight}, {index: 2, vgpu: {memoryStep: 1000}}]"
    )
    with pytest.raises(NodeConfigError) as caught:
        parse_node_config(yaml.safe_load(text), "f.yaml")
    assert [line.split(": ")[1] for line in caught.value.problems] == [
        "gpus[0].index",
        "gpus[0].mode",
        "gpus[1].model",
        "gpus[1].packing",
        "gpus[2].vgpu.memoryStep",
    ]


def test_vgpu_enforcement_defaults_to_mps_and_is_set_per_gpu() -> None:
    config = parse_node_config(
        {
            "default": {"mode": "vgpu-capacity"},
            "gpus": [{"index": 1, "mode": "vgpu-capacity", "vgpu": {"enforcement": "hami-core"}}],
        },
        "test",
    )

    assert config.default.enforcement == "mps"
    assert config.gpus[0].settings.enforcement == "hami-core"


def test_under_mps_no_partition_size_publishes_more_slots_than_one_mps_server_takes() -> None:
    gpu = simulated_node("dgx-h100")[0]
    tiny = VgpuPartitionSize(GIB, cores=1)

    assert partition_slots(gpu, tiny, "hami-core") == 79
    assert partition_slots(gpu, tiny, "mps") == MPS_CLIENTS_PER_GPU == 48
