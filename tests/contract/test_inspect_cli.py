"""`dra-driver inspect`: the inventory as a table, and exactly the slices `node` would publish."""

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from dra_driver.cli import main
from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.slices import plan_slices, slices_to_api
from tests.support.claims import allocate
from tests.support.nodes import simulated_node


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "inspect", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_table_lists_every_device_with_its_gpu_and_size() -> None:
    result = inspect("--hardware", "simulated:mixed", "--node-name", "node-a")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("hardware: simulated profile mixed")
    header = next(line for line in lines if line.startswith("DEVICE"))
    assert header.split() == [
        "DEVICE",
        "TYPE",
        "GPU",
        "NUMA",
        "PROFILE/SIZE",
        "MEMORY",
        "COMPUTE",
        "PARTITION-TYPE",
        "SHARING",
    ]
    inventory = node_inventory(simulated_node("mixed"), load_node_config(None))
    rows = lines[lines.index(header) + 1 : -1]
    assert [row.split()[0] for row in rows] == [device.name for device in inventory.devices]
    assert lines[-1] == f"{len(inventory.devices)} devices, 0 counter sets"


def test_yaml_output_is_the_slices_node_publishes_for_the_configured_node(tmp_path: Path) -> None:
    node_config = tmp_path / "node.yaml"
    node_config.write_text("default: {mode: mig-dynamic}\n")
    result = inspect(
        "--hardware",
        "simulated:dgx-h100-mig",
        "--node-name",
        "node-a",
        "--node-config",
        str(node_config),
        "-o",
        "yaml",
        "--kubernetes-version",
        "1.36",
    )

    assert result.returncode == 0, result.stderr
    printed = list(yaml.safe_load_all(result.stdout))
    inventory = node_inventory(simulated_node("dgx-h100-mig"), load_node_config(node_config))
    assert printed == slices_to_api(plan_slices(inventory, "1.35"), "gpu.dra-driver.dev", "node-a")
    assert len(printed) == 5


def test_the_1_34_layout_is_chosen_by_version() -> None:
    result = inspect(
        "--hardware", "simulated:dgx-h100", "--node-name", "n", "-o", "yaml", "--kubernetes-version", "1.34"
    )
    assert result.returncode == 0, result.stderr
    (only,) = yaml.safe_load_all(result.stdout)
    assert len(only["spec"]["devices"]) == 8


def test_a_bad_node_config_is_reported_with_the_gpu_and_the_setting(tmp_path: Path) -> None:
    node_config = tmp_path / "node.yaml"
    node_config.write_text(
        "gpus: [{index: 0, mode: vgpu-partitions, vgpu: {partitions: [{memory: 99Gi}]}}]\n"
    )
    result = inspect("--hardware", "simulated:t4x4", "--node-name", "n", "--node-config", str(node_config))

    assert result.returncode == 2
    gpu = simulated_node("t4x4", "n")[0]
    assert result.stderr == (
        f"dra-driver inspect: node config {node_config}: gpus[0].vgpu.partitions[0].memory: 101376Mi "
        f"does not fit GPU 0 (Tesla T4, {gpu.uuid}), which has 15360Mi\n"
    )


def test_the_node_name_defaults_to_the_host_name_and_bad_versions_are_refused() -> None:
    result = inspect("--hardware", "simulated:t4x4", "-o", "yaml")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"]["nodeName"] == socket.gethostname().lower()

    refused = inspect("--hardware", "simulated:t4x4", "--kubernetes-version", "1.33")
    assert refused.returncode == 2
    said = "--kubernetes-version: 1.33 is not supported: this release supports Kubernetes 1.34 to 1.37"
    assert said in refused.stderr


def test_the_table_shows_the_standard_numa_node_and_the_partition_type(tmp_path: Path) -> None:
    node_config = tmp_path / "node.yaml"
    node_config.write_text(
        "gpus: [{index: 4, mode: vgpu-partitions, vgpu: {partitions: [{memory: 20Gi}]}}]\n"
    )
    result = inspect("--hardware", "simulated:mixed", "--node-name", "n", "--node-config", str(node_config))

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("DEVICE"))
    numa_at, type_at = header.index("NUMA"), header.index("PARTITION-TYPE")
    inventory = node_inventory(simulated_node("mixed", "n"), load_node_config(node_config))
    rows = {row.split()[0]: row for row in lines[lines.index(header) + 1 : -1]}
    for device in inventory.devices:
        row = rows[device.name]
        assert row[numa_at:].split()[0] == str(device.attributes["resource.kubernetes.io/numaNode"])
        shown = row[type_at:].split()[0] if row[type_at] != " " else ""
        assert shown == device.attributes.get("partitionType", ""), device.name
    assert rows["gpu-4-vgpu-20gi-3"][type_at:].split()[0] == "gpu-4-vgpu-20gi"


def test_yaml_for_1_37_names_the_partition_type_attribute_and_for_1_36_does_not(tmp_path: Path) -> None:
    node_config = tmp_path / "node.yaml"
    node_config.write_text("default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: 10Gi}]}}\n")

    def published(version: str) -> list[dict[str, object]]:
        result = inspect(
            "--hardware",
            "simulated:t4x4",
            "--node-name",
            "n",
            "--node-config",
            str(node_config),
            "-o",
            "yaml",
            "--kubernetes-version",
            version,
        )
        assert result.returncode == 0, result.stderr
        return [body["spec"] for body in yaml.safe_load_all(result.stdout)]

    newer = published("1.37")
    assert [spec.get("partitionTypeAttribute") for spec in newer if spec.get("devices")] == [
        "gpu.dra-driver.dev/partitionType"
    ]
    assert not any("partitionTypeAttribute" in spec for spec in published("1.36"))


def test_the_layout_has_a_row_per_gpu_with_its_slices_or_its_memory() -> None:
    from dra_driver.packing.allocator import Pool  # noqa: PLC0415
    from dra_driver.packing.layout import gpu_layouts  # noqa: PLC0415

    result = inspect("--hardware", "simulated:mixed", "--node-name", "node-a", "-o", "layout")

    assert result.returncode == 0, result.stderr
    hardware, legend, *rows = result.stdout.splitlines()
    assert hardware.startswith("hardware: simulated profile mixed")
    assert legend.startswith("legend: ")
    inventory = node_inventory(simulated_node("mixed"), load_node_config(None))
    layouts = gpu_layouts(Pool.from_inventory(inventory, "gpu.dra-driver.dev"), ())
    assert [row.split()[:3] for row in rows] == [
        ["GPU", str(layout.index), layout.kind] for layout in layouts
    ]
    for row, layout in zip(rows, layouts, strict=True):
        picture = row.split("[", 1)[1].split("]", 1)[0]
        # Nothing is allocated: a MIG GPU's slices are its free instances ("-") or free (".").
        assert len(picture) == (2 * layout.memory_slices - 1 if layout.kind == "mig" else 40)
        assert set(picture) <= {"-", ".", " ", "|"}


def test_the_layout_marks_the_devices_allocated_claims_hold(
    kubeconfig: Path, claims_api: client.ResourceV1Api, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = node_inventory(simulated_node("mixed"), load_node_config(None))
    static_mig = next(device for device in inventory.devices if device.type == "mig")
    allocate(claims_api, "whole", {"gpu": "gpu-4"}, pool="node-a")
    allocate(claims_api, "slice", {"mig": static_mig.name}, pool="node-a", namespace="team")
    allocate(claims_api, "other-node", {"gpu": "gpu-5"}, pool="node-b")

    args = ["inspect", "--hardware", "simulated:mixed", "--node-name", "node-a", "-o", "layout"]

    code = main([*args, "--kubeconfig", str(kubeconfig)])

    assert code == 0, capsys.readouterr().err
    _, legend, *rows = capsys.readouterr().out.splitlines()
    mark = {label: letter for letter, label in re.findall(r"(\w) = ([^,]+)", legend)}
    assert set(mark) == {"claim default/whole", "claim team/slice"}
    by_gpu = {int(row.split()[1]): row.split("[", 1)[1].split("]", 1)[0] for row in rows}
    assert set(by_gpu[4]) == {mark["claim default/whole"]}
    assert set(by_gpu[5]) == {"."}
    gpu = inventory.gpu_of_device[static_mig.name]
    start = int(static_mig.attributes["placementStart"])  # type: ignore[arg-type]
    size = int(static_mig.attributes["placementSize"])  # type: ignore[arg-type]
    cells = by_gpu[gpu.index][0::2]
    assert [i for i, cell in enumerate(cells) if cell == mark["claim team/slice"]] == list(
        range(start, start + size)
    )
