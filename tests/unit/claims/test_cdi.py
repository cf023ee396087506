import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from dra_driver.claims.edits.cdi import (
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    Hook,
    InvalidCdiName,
    Mount,
    claim_spec,
    claim_spec_file_name,
    common_device_id,
    minimum_cdi_version,
    node_spec,
    node_spec_file_name,
)
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.driver_edits import common_edits, control_device_nodes
from dra_driver.claims.edits.mig_caps import capability_edits, mig_instance_capabilities
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.status.device_metadata import MetadataDevice, mount_edits, request_metadata
from dra_driver.hardware.driver_root import DeviceRoot, discover_driver

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

    directory.write(UID, spec)  # the directory does not exist yet: it is made
    path = directory.path_for(UID)

    assert (
        path.name
        == claim_spec_file_name("gpu.dra-driver.dev", UID)
        == f"k8s.gpu.dra-driver.dev-claim_{UID}.json"
    )
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    assert json.loads(path.read_text())["cdiVersion"] == "0.5.0"
    assert directory.claim_uids() == {UID}
    directory.remove(UID)
    directory.remove(UID)  # removing twice is fine
    assert directory.claim_uids() == set()
    assert list(path.parent.iterdir()) == []


# -- mounts, hooks, host paths and the node-wide spec ---------------------------------------------

# The upstream CDI schema, vendored with its licence and source commit (tests/data/cdi-schema/SOURCE).
CDI_SCHEMA_DIR = Path(__file__).resolve().parents[2] / "data" / "cdi-schema"
DRIVER = "gpu.dra-driver.dev"
VERSION = "580.95.05"
# Every version podman 4.3.1 (Debian 12) accepts; anything newer makes it refuse the spec.
VERSIONS_PODMAN_ACCEPTS = {"0.3.0", "0.4.0", "0.5.0"}


@pytest.fixture(scope="module")
def cdi_schema() -> Draft7Validator:
    if not (CDI_SCHEMA_DIR / "schema.json").is_file():
        pytest.fail(f"the CDI JSON schema is not at {CDI_SCHEMA_DIR}")
    schema = json.loads((CDI_SCHEMA_DIR / "schema.json").read_text())
    definitions = Resource.from_contents(
        json.loads((CDI_SCHEMA_DIR / "defs.json").read_text()), default_specification=DRAFT7
    )
    return Draft7Validator(schema, registry=Registry().with_resource("defs.json", definitions))


def assert_valid(validator: Draft7Validator, document: dict[str, Any]) -> None:
    errors = [f"{list(error.absolute_path)}: {error.message}" for error in validator.iter_errors(document)]
    assert errors == []


def driver_tree(root: Path) -> Path:
    """A small driver root: one library with its SONAME link, one tool."""
    library = root / f"usr/lib64/libcuda.so.{VERSION}"
    library.parent.mkdir(parents=True)
    library.write_text("not really a library")
    (root / "usr/lib64/libcuda.so.1").symlink_to(library.name)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    return root


def test_mounts_and_hooks_render_as_the_schema_names_them() -> None:
    edits = ContainerEdits(
        mounts=(
            Mount("/host/lib/libcuda.so.1", "/usr/lib64/libcuda.so.1", ("ro", "nosuid", "nodev", "bind")),
        ),
        hooks=(
            Hook(
                "createContainer", "/usr/bin/hook", ("hook", "update", "--folder", "/usr/lib64"), ("DEBUG=1",)
            ),
            Hook("poststop", "/usr/bin/cleanup"),
        ),
    )

    assert edits.to_json() == {
        "mounts": [
            {
                "hostPath": "/host/lib/libcuda.so.1",
                "containerPath": "/usr/lib64/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/hook",
                "args": ["hook", "update", "--folder", "/usr/lib64"],
                "env": ["DEBUG=1"],
            },
            {"hookName": "poststop", "path": "/usr/bin/cleanup"},
        ],
    }
    assert Mount("/a", "/b").to_json() == {"hostPath": "/a", "containerPath": "/b"}
    # Mounts and hooks are as old as CDI 0.3.0, and the mount `type` (0.4.0) is never written.
    assert minimum_cdi_version(claim_spec(DRIVER, LETTER_UID, [("gpu-0", edits)])) == "0.3.0"


def test_a_device_node_with_a_host_path_needs_cdi_0_5_0() -> None:
    elsewhere = DeviceNode.under(Path("/run/nvidia/driver"), "/dev/nvidiactl")
    here = DeviceNode.under(Path("/"), "/dev/nvidiactl")

    assert elsewhere.to_json() == {"path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"}
    assert here.to_json() == {"path": "/dev/nvidiactl"}
    assert (
        minimum_cdi_version(node_spec(DRIVER, ContainerEdits(device_nodes=(here, "/dev/nvidia0")))) == "0.3.0"
    )
    assert minimum_cdi_version(node_spec(DRIVER, ContainerEdits(device_nodes=(elsewhere,)))) == "0.5.0"


def test_a_dot_in_the_class_needs_cdi_0_6_0() -> None:
    assert minimum_cdi_version(CdiSpec(kind="vendor.com/mig.gpu", devices=())) == "0.6.0"


def test_the_node_spec_has_one_common_device_and_its_own_file(tmp_path: Path) -> None:
    common = ContainerEdits(device_nodes=("/dev/nvidiactl",), mounts=(Mount("/a", "/a", ("ro", "bind")),))
    spec = node_spec(DRIVER, common)

    assert spec.to_json() == {
        "cdiVersion": "0.3.0",
        "kind": "k8s.gpu.dra-driver.dev/node",
        "devices": [{"name": "common", "containerEdits": common.to_json()}],
    }
    assert (
        spec.qualified_name(spec.devices[0])
        == common_device_id(DRIVER)
        == "k8s.gpu.dra-driver.dev/node=common"
    )
    assert node_spec_file_name(DRIVER) == "k8s.gpu.dra-driver.dev-node.json"

    directory = CdiSpecDirectory(tmp_path / "cdi", DRIVER)
    directory.write(UID, claim_spec(DRIVER, UID, [("gpu-0", ContainerEdits())]))
    path = directory.write_node_spec(ContainerEdits())
    path = directory.write_node_spec(common)  # written again at every start: replaced whole

    assert path == directory.node_spec_path == tmp_path / "cdi" / "k8s.gpu.dra-driver.dev-node.json"
    assert json.loads(path.read_text()) == spec.to_json()
    assert sorted(p.name for p in path.parent.iterdir()) == [claim_spec_file_name(DRIVER, UID), path.name]
    assert directory.claim_uids() == {UID}  # the node spec is no claim's


@pytest.mark.parametrize("driver", ["gpu_", "gpu.example.com-", "gpu/../../etc", "gpu example"])
def test_node_spec_names_are_checked_like_claim_spec_names(driver: str, tmp_path: Path) -> None:
    for build in (node_spec_file_name, common_device_id, lambda name: node_spec(name, ContainerEdits())):
        with pytest.raises(InvalidCdiName, match="breaks the CDI naming rules"):
            build(driver)
    with pytest.raises(InvalidCdiName):
        CdiSpecDirectory(tmp_path, driver).write_node_spec(ContainerEdits())
    assert list(tmp_path.iterdir()) == []


def test_generated_specs_match_the_cdi_schema_and_a_version_podman_accepts(
    cdi_schema: Draft7Validator, tmp_path: Path
) -> None:
    discovery = discover_driver(driver_tree(tmp_path / "driver"), VERSION)
    (tmp_path / "proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0").mkdir(parents=True)
    for relative, minor in (("gi1/access", 30), ("gi1/ci0/access", 31)):
        (tmp_path / "proc/driver/nvidia/capabilities/gpu0/mig" / relative).write_text(
            f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n"
        )
    caps = mig_instance_capabilities(tmp_path / "proc", gpu_minor=0, gpu_instance=1, compute_instance=0)
    # A UID that starts with a letter: the spec then needs no CDI 0.5.0 for its device names.
    lettered = "a" + UID[1:]
    (metadata,) = request_metadata(
        DRIVER,
        claim_ref("default", "c", lettered),
        None,
        [MetadataDevice("gpu", "node-a", "gpu-0", {"index": 0})],
    )

    specs = {
        "common, plain host": node_spec(
            DRIVER,
            common_edits(
                discovery, control_device_nodes(DeviceRoot(Path("/"), Path("/"))), Path("/"), "x86_64"
            ),
        ),
        "common, driver container": node_spec(
            DRIVER,
            common_edits(
                discovery, control_device_nodes(DeviceRoot(tmp_path, tmp_path)), tmp_path, "aarch64"
            ),
        ),
        "claim with a MIG device": claim_spec(
            DRIVER,
            UID,
            [
                (
                    "gpu-0",
                    ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=void",), device_nodes=("/dev/nvidia0",)),
                ),
                ("gpu-0-mig-1g", capability_edits(caps, tmp_path)),
            ],
        ),
        "claim with a device metadata mount": claim_spec(
            DRIVER,
            lettered,
            [
                ("gpu-0", ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=void",))),
                (
                    metadata.cdi_device,
                    mount_edits("/var/lib/kubelet/plugins/x/dra-device-metadata", lettered, metadata),
                ),
            ],
        ),
    }

    rendered = {name: spec.to_json() for name, spec in specs.items()}
    for document in rendered.values():
        assert_valid(cdi_schema, document)
    assert {name: document["cdiVersion"] for name, document in rendered.items()} == {
        "common, plain host": "0.3.0",
        "common, driver container": "0.5.0",
        "claim with a MIG device": "0.5.0",
        # A file mount and a dotted device name need nothing newer than the oldest version.
        "claim with a device metadata mount": "0.3.0",
    }
    mounts = rendered["common, plain host"]["devices"][0]["containerEdits"]["mounts"]
    assert {m["containerPath"] for m in mounts} == {
        f"/usr/lib64/libcuda.so.{VERSION}",
        "/usr/lib64/libcuda.so.1",
        f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/bin/nvidia-smi",
    }


def test_the_schema_check_catches_what_runtimes_refuse(cdi_schema: Draft7Validator) -> None:
    """Guards the check above: the schema and its definitions are really applied."""
    document = node_spec(DRIVER, ContainerEdits(mounts=(Mount("/a", "/a"),))).to_json()
    del document["devices"][0]["containerEdits"]["mounts"][0]["containerPath"]
    assert [error.message for error in cdi_schema.iter_errors(document)] == [
        "'containerPath' is a required property"
    ]


_paths = st.lists(st.from_regex(r"/[a-z0-9._-]{1,12}", fullmatch=True), min_size=1, max_size=3).map("".join)
_device_nodes = st.builds(DeviceNode, path=_paths.map(lambda p: "/dev" + p), host_path=st.just("") | _paths)
_mounts = st.builds(
    Mount,
    host_path=_paths,
    container_path=_paths,
    options=st.tuples() | st.just(("ro", "nosuid", "nodev", "bind")),
)
_hooks = st.builds(
    Hook,
    hook_name=st.sampled_from(["createContainer", "startContainer", "poststop"]),
    path=_paths,
    args=st.lists(st.text(max_size=5)).map(tuple),
)
_edits = st.builds(
    ContainerEdits,
    env=st.lists(st.from_regex(r"[A-Z_]{1,8}=[a-z0-9]*", fullmatch=True), max_size=2).map(tuple),
    device_nodes=st.lists(_device_nodes | _paths, max_size=3).map(tuple),
    mounts=st.lists(_mounts, max_size=3).map(tuple),
    hooks=st.lists(_hooks, max_size=2).map(tuple),
)


@given(uid=st.uuids().map(str), edits=st.lists(_edits, min_size=1, max_size=3), common=_edits)
def test_everything_we_can_generate_is_schema_valid_and_at_most_cdi_0_5_0(
    cdi_schema: Draft7Validator, uid: str, edits: list[ContainerEdits], common: ContainerEdits
) -> None:
    claim = claim_spec(DRIVER, uid, [(f"gpu-{i}", e) for i, e in enumerate(edits)])
    for spec in (claim, node_spec(DRIVER, common)):
        document = spec.to_json()
        assert_valid(cdi_schema, document)
        assert document["cdiVersion"] in VERSIONS_PODMAN_ACCEPTS
        host_paths = any(
            "hostPath" in n for d in document["devices"] for n in d["containerEdits"].get("deviceNodes", [])
        )
        digit_names = any(not d["name"][0].isalpha() for d in document["devices"])
        assert (document["cdiVersion"] == "0.5.0") == (host_paths or digit_names)
