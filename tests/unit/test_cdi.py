import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.claims.cdi import (
    CdiSpec,
    CdiSpecDirectory,
    ContainerEdits,
    InvalidCdiName,
    claim_spec,
    claim_spec_file_name,
    minimum_cdi_version,
)

UID = "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17"
LETTER_UID = "af9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17"


def test_a_claim_spec_names_devices_after_the_claim_uid() -> None:
    spec = claim_spec("gpu.dra-driver.dev", UID, [("gpu-0", ContainerEdits(env=("A=1",)))])

    assert spec.to_json() == {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.dra-driver.dev/claim",
        "devices": [{"name": f"{UID}-gpu-0", "containerEdits": {"env": ["A=1"]}}],
    }
    assert spec.qualified_name(spec.devices[0]) == f"k8s.gpu.dra-driver.dev/claim={UID}-gpu-0"


def test_device_nodes_render_as_paths_that_need_no_newer_version() -> None:
    spec = claim_spec(
        "d.example.com", LETTER_UID, [("gpu-1", ContainerEdits(device_nodes=("/dev/nvidia1",)))]
    )

    assert spec.to_json()["devices"][0]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia1"}]}
    assert minimum_cdi_version(spec) == "0.3.0"


@given(st.uuids().map(str))
def test_the_version_is_the_minimum_the_device_names_need(uid: str) -> None:
    spec = claim_spec("gpu.dra-driver.dev", uid, [("gpu-0", ContainerEdits())])
    expected = "0.3.0" if uid[0].isalpha() else "0.5.0"
    assert minimum_cdi_version(spec) == expected


def test_an_empty_spec_needs_the_oldest_version() -> None:
    assert minimum_cdi_version(CdiSpec(kind="k8s.x/claim", devices=())) == "0.3.0"


@pytest.mark.parametrize(
    ("driver", "uid", "device"),
    [
        ("gpu.dra-driver.dev", "x/y", "gpu-0"),
        ("gpu.dra-driver.dev", UID, "gpu-0-"),
        ("gpu_", UID, "gpu-0"),
        ("gpu.dra-driver.dev", UID, "gpu 0"),
    ],
)
def test_names_that_break_the_cdi_rules_are_refused(driver: str, uid: str, device: str) -> None:
    with pytest.raises(InvalidCdiName, match="breaks the CDI naming rules"):
        claim_spec(driver, uid, [(device, ContainerEdits())])


def test_spec_files_are_written_atomically_and_removed(tmp_path: Path) -> None:
    directory = CdiSpecDirectory(tmp_path / "cdi", "gpu.dra-driver.dev")
    spec = claim_spec("gpu.dra-driver.dev", UID, [("gpu-0", ContainerEdits(env=("A=1",)))])

    path = directory.write(UID, spec)

    assert (
        path.name
        == claim_spec_file_name("gpu.dra-driver.dev", UID)
        == f"k8s.gpu.dra-driver.dev-claim_{UID}.json"
    )
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    assert re.search(r'"cdiVersion": "0.5.0"', path.read_text())
    assert directory.claim_uids() == {UID}
    directory.remove(UID)
    directory.remove(UID)  # removing twice is fine
    assert directory.claim_uids() == set()
    assert list(path.parent.iterdir()) == []
