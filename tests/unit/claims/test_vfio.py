"""Mode vfio on a simulated sysfs: a GPU offered to VMs, bound to vfio-pci by prepare, given back
by unprepare and by the rollback of a prepare cut short. Not run on real hardware."""

import json
from pathlib import Path

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.effect_entries import VfioEntry
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.devices.classes import device_classes
from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.modes.registry import shipped_class_types
from dra_driver.devices.node_config import NodeConfig
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.pci_binding import VFIO_DRIVER
from dra_driver.hardware.simulated_pci import GPU_DRIVER, SimulatedPciBinding, make_pci_tree
from tests.support.engines import simulated_engine
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import simulated_node

PROFILE = "l4x8"
VFIO = NodeConfig(default=GpuSettings(mode="vfio"))
GPUS = simulated_node(PROFILE)


def sysfs(tmp: Path, drivers: tuple[str, ...] = (GPU_DRIVER, VFIO_DRIVER)) -> SimulatedPciBinding:
    make_pci_tree(tmp / "sys", GPUS, drivers)
    return SimulatedPciBinding(tmp / "sys")


def spec_nodes(tmp: Path, uid: str) -> list[str]:
    (spec,) = (tmp / "cdi").glob(f"*{uid}*")
    devices = json.loads(spec.read_text())["devices"]
    return [node["path"] for device in devices for node in device["containerEdits"].get("deviceNodes", [])]


def test_a_gpu_in_mode_vfio_is_offered_with_its_iommu_group_and_pci_address() -> None:
    inventory = node_inventory(GPUS, VFIO)
    device = inventory.device_by_name["gpu-2"]
    assert device.type == "vfio"
    assert device.attributes["type"] == "vfio"
    assert device.attributes["iommuGroup"] == GPUS[2].iommu_group
    assert device.attributes["resource.kubernetes.io/pciBusID"] == GPUS[2].pci_bus_id


def test_a_gpu_without_an_iommu_group_is_not_offered_and_the_note_says_why() -> None:
    from msgspec.structs import replace  # noqa: PLC0415

    inventory = node_inventory([replace(GPUS[0], iommu_group=None)], VFIO)
    assert inventory.devices == ()
    assert any("no IOMMU group" in note and "intel_iommu=on" in note for note in inventory.notes)


async def test_prepare_binds_the_gpu_to_vfio_and_unprepare_gives_it_back(tmp_path: Path) -> None:
    pci = sysfs(tmp_path)
    claims = MemoryClaims()
    claim = claims.add("vm", {"device": "gpu-3"})
    engine = simulated_engine(tmp_path, claims, PROFILE, VFIO, pci=pci)
    await engine.load_state()
    address = GPUS[3].pci_bus_id

    outcome = (await engine.prepare([claim]))[claim.uid]

    assert outcome.error == ""
    assert pci.driver(address) == VFIO_DRIVER
    assert pci.driver(GPUS[4].pci_bus_id) == GPU_DRIVER, "only the claim's GPU"
    assert engine.prepared_claims[claim.uid].effects == (VfioEntry(address, GPU_DRIVER),)
    assert spec_nodes(tmp_path, claim.uid) == ["/dev/vfio/vfio", f"/dev/vfio/{GPUS[3].iommu_group}"]
    again = (await engine.prepare([claim]))[claim.uid]
    assert again == outcome, "a second prepare answers from the record"

    assert (await engine.unprepare([claim]))[claim.uid] == ""
    assert pci.driver(address) == GPU_DRIVER
    assert list((tmp_path / "cdi").glob(f"*{claim.uid}*")) == []
    assert (await engine.unprepare([claim]))[claim.uid] == "", "and again, nothing to do"
    engine.close()


async def test_a_prepare_cut_short_after_the_bind_is_given_back_at_start(tmp_path: Path) -> None:
    pci = sysfs(tmp_path)
    claims = MemoryClaims()
    claim = claims.add("vm", {"device": "gpu-5"})
    first = simulated_engine(tmp_path, claims, PROFILE, VFIO, pci=pci)
    await first.load_state()
    assert (await first.prepare([claim]))[claim.uid].error == ""
    first.close()
    # As if the agent died after the bind and before "prepared" was written.
    store = ClaimRecordStore(tmp_path / "state")
    record = store.read(claim.uid)
    assert record is not None
    from msgspec.structs import replace  # noqa: PLC0415

    store.save(replace(record, state="preparing", devices=()))

    restarted = simulated_engine(tmp_path, claims, PROFILE, VFIO, pci=pci)
    await restarted.load_state()

    assert pci.driver(GPUS[5].pci_bus_id) == GPU_DRIVER
    assert store.read(claim.uid) is None
    assert restarted.prepared_claims == {}
    restarted.close()


async def test_without_the_vfio_module_the_claim_is_refused_and_the_gpu_stays_with_its_driver(
    tmp_path: Path,
) -> None:
    pci = sysfs(tmp_path, drivers=(GPU_DRIVER,))
    claims = MemoryClaims()
    claim = claims.add("vm", {"device": "gpu-0"})
    engine = simulated_engine(tmp_path, claims, PROFILE, VFIO, pci=pci)
    await engine.load_state()

    outcome = (await engine.prepare([claim]))[claim.uid]

    assert "modprobe vfio-pci" in outcome.error and outcome.error.startswith("claim default/vm")
    assert pci.driver(GPUS[0].pci_bus_id) == GPU_DRIVER
    assert ClaimRecordStore(tmp_path / "state").read(claim.uid) is None
    engine.close()


async def test_a_gpu_bound_to_vfio_by_someone_else_is_refused_untouched(tmp_path: Path) -> None:
    pci = sysfs(tmp_path)
    pci.bind_vfio(GPUS[1].pci_bus_id)  # a VM started by hand
    claims = MemoryClaims()
    claim = claims.add("vm", {"device": "gpu-1"})
    engine = simulated_engine(tmp_path, claims, PROFILE, VFIO, pci=pci)
    await engine.load_state()

    outcome = (await engine.prepare([claim]))[claim.uid]

    assert "is bound to vfio-pci, not to a GPU driver" in outcome.error
    assert pci.driver(GPUS[1].pci_bus_id) == VFIO_DRIVER
    engine.close()


async def test_a_node_without_a_pci_binding_refuses_vfio_claims(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("vm", {"device": "gpu-0"})
    engine = simulated_engine(tmp_path, claims, PROFILE, VFIO)
    await engine.load_state()
    assert "cannot bind GPUs to vfio-pci" in (await engine.prepare([claim]))[claim.uid].error
    engine.close()


async def test_a_sharing_setting_for_a_vms_gpu_is_refused_before_anything_is_bound(tmp_path: Path) -> None:
    pci = sysfs(tmp_path)
    claims = MemoryClaims()
    config = {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": "gpu.dra-driver.dev",
            "parameters": {
                "apiVersion": "resource.dra-driver.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
            },
        },
    }
    claim = claims.add("vm", {"device": "gpu-6"}, config=[config])
    engine = simulated_engine(tmp_path, claims, PROFILE, VFIO, pci=pci)
    await engine.load_state()

    outcome = (await engine.prepare([claim]))[claim.uid]

    assert "is given to a VM (mode vfio), which no sharing setting applies to" in outcome.error
    assert pci.driver(GPUS[6].pci_bus_id) == GPU_DRIVER
    engine.close()


def test_an_address_that_is_not_a_pci_address_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="is not a PCI address"):
        sysfs(tmp_path).driver("../../etc")


def test_no_class_is_shipped_for_a_vms_gpu_until_mode_vfio_has_run_on_real_hardware() -> None:
    names = [device_class["metadata"]["name"] for device_class in device_classes(DEFAULT_DRIVER_NAME)]
    assert shipped_class_types() == ("gpu", "mig", "vgpu")
    assert not [name for name in names if name.startswith("vfio.")]
    assert "gpu.dra-driver.dev" in names
