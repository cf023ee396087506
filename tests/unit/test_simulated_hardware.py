import asyncio
from pathlib import Path

import pytest

from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.simulated import (
    SimulatedBackend,
    gpu_models,
    node_profiles,
    resolve_node_spec,
    simulated_gpus,
)


@pytest.mark.parametrize("profile", sorted(node_profiles()))
def test_every_profile_resolves_to_gpus_with_unique_identities(profile: str) -> None:
    spec = resolve_node_spec(profile)
    gpus = simulated_gpus("node-a", spec)

    assert len(gpus) == spec.count
    assert len({g.uuid for g in gpus}) == len({g.pci_bus_id for g in gpus}) == spec.count
    assert [g.minor for g in gpus] == list(range(spec.count))
    assert all(g.uuid.startswith("GPU-") and g.memory_bytes == spec.model.memory_mib * 2**20 for g in gpus)


def test_uuids_are_the_same_on_every_run_and_differ_between_nodes() -> None:
    spec = resolve_node_spec("dgx-h100")
    assert simulated_gpus("node-a", spec) == simulated_gpus("node-a", spec)
    assert {g.uuid for g in simulated_gpus("node-a", spec)}.isdisjoint(
        g.uuid for g in simulated_gpus("node-b", spec)
    )


def test_a_yaml_file_describes_a_custom_node(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model: L4\ncount: 2\ndriverVersion: '570.124.06'\n")

    backend = SimulatedBackend("n", resolve_node_spec(str(path)))
    gpus = asyncio.run(backend.discover())

    assert [g.product_name for g in gpus] == ["NVIDIA L4", "NVIDIA L4"]
    assert gpus[0].driver_version == "570.124.06"
    assert backend.description == f"simulated file {path}: 2x NVIDIA L4"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("model: Z100\ncount: 1\n", "field 'model': unknown GPU model 'Z100'; known models: A10, "),
        ("model: L4\ncount: 0\n", "field 'count': expected an integer from 1 to 16, got 0"),
        ("model: L4\ncount: true\n", "field 'count': expected an integer from 1 to 16, got True"),
        ("model: L4\ncount: 1\nmig: all\n", "unknown field(s) ['mig']"),
        (
            "model: L4\ncount: 1\ndriverVersion: latest\n",
            "field 'driverVersion': expected a dotted version string",
        ),
        ("- L4\n", "expected a mapping with fields"),
        ("model: [L4\n", "not valid YAML"),
    ],
)
def test_bad_node_files_name_the_file_and_the_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(content)
    with pytest.raises(HardwareError) as raised:
        resolve_node_spec(str(path))
    assert str(path) in str(raised.value)
    assert message in str(raised.value)


def test_a_missing_file_and_an_unknown_profile_are_clear(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read it: No such file or directory"):
        resolve_node_spec(str(tmp_path / "absent.yaml"))
    with pytest.raises(
        HardwareError, match="unknown simulated node profile 'dgx-z'; known profiles: a30x4, "
    ):
        resolve_node_spec("dgx-z")


def test_catalog_models_carry_the_catalog_facts() -> None:
    h100 = gpu_models()["H100-SXM5-80GB"]
    assert (h100.product_name, h100.memory_mib, h100.multiprocessors) == ("NVIDIA H100 80GB HBM3", 81559, 132)
