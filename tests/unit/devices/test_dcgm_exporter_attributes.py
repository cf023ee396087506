"""What dcgm-exporter's DRA mode (--kubernetes-enable-dra, v4.x) reads of a ResourceSlice device to
map a claim's device to a GPU: the unqualified string attributes `type` ("gpu" or "mig"), `uuid`,
and for MIG `parentUUID` and `profile`. Our whole-GPU and MIG devices carry them under those
names; vGPU devices have type "vgpu", which it does not know (it logs and skips them)."""

import yaml

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config_decode import parse_node_config
from tests.support.nodes import simulated_node

CONFIG = """\
gpus:
  - {index: 0, mode: mig-static}
  - {index: 4, mode: vgpu-capacity}
"""


def test_gpu_and_mig_devices_carry_the_attributes_dcgm_exporter_reads() -> None:
    inventory = node_inventory(simulated_node("mixed"), parse_node_config(yaml.safe_load(CONFIG), "t"))
    gpus = {gpu.uuid for gpu in simulated_node("mixed")}
    by_type: dict[str, list[dict[str, object]]] = {}
    for device in inventory.devices:
        by_type.setdefault(str(device.attributes["type"]), []).append(dict(device.attributes))

    assert all(attributes["uuid"] in gpus for attributes in by_type["gpu"])
    assert by_type["mig"]
    for attributes in by_type["mig"]:
        assert attributes["parentUUID"] in gpus
        assert isinstance(attributes["profile"], str) and attributes["profile"]
        assert isinstance(attributes["uuid"], str) and str(attributes["uuid"]).startswith("MIG-")
    assert {attributes["type"] for attributes in by_type["vgpu"]} == {"vgpu"}
