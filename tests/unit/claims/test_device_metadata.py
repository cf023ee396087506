"""The KEP-5304 device metadata files, as rendered from what prepare knows (pure)."""

import json
from pathlib import PurePosixPath

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.base.compact_json import compact_json
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.status import device_metadata
from dra_driver.claims.status.device_metadata import MetadataDevice, request_metadata
from dra_driver.devices.model import AttributeValue, Version, attribute_to_api
from tests.support.device_metadata_schema import metadata_stream, validate_metadata
from tests.support.nodes import inventory_for

DRIVER = "gpu.dra-driver.dev"
REF = claim_ref("team-a", "training", "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f")
GPU = MetadataDevice(
    request="gpu",
    pool="node-a",
    name="gpu-0",
    attributes={
        "uuid": "GPU-0d1e2f30-1111-2222-3333-444455556666",
        "index": 0,
        "driverVersion": Version("580.95.5"),
        "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
        "type": "gpu",
    },
)


def test_a_request_file_holds_each_api_version_newest_first_with_the_same_content() -> None:
    (metadata,) = request_metadata(DRIVER, REF, None, [GPU])
    beta, alpha = metadata_stream(metadata.content)
    # One object per line, so a shell reader can pick its version with head or grep.
    assert [json.loads(line) for line in metadata.content.splitlines()] == [beta, alpha]

    assert [beta["apiVersion"], alpha["apiVersion"]] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    assert {**beta, "apiVersion": ""} == {**alpha, "apiVersion": ""}
    assert beta == {
        "kind": "DeviceMetadata",
        "apiVersion": "metadata.resource.k8s.io/v1beta1",
        "metadata": {"name": "training", "namespace": "team-a", "uid": REF.uid, "generation": 1},
        "requests": [
            {
                "name": "gpu",
                "devices": [
                    {
                        "driver": DRIVER,
                        "pool": "node-a",
                        "name": "gpu-0",
                        "attributes": {
                            "driverVersion": {"version": "580.95.5"},
                            "index": {"int": 0},
                            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
                            "type": {"string": "gpu"},
                            "uuid": {"string": "GPU-0d1e2f30-1111-2222-3333-444455556666"},
                        },
                    }
                ],
            }
        ],
    }
    for document in (beta, alpha):
        validate_metadata(document)


def test_a_claim_the_pod_names_is_under_resourceclaims_and_a_template_claim_under_its_pod_name() -> None:
    (direct,) = request_metadata(DRIVER, REF, None, [GPU])
    (templated,) = request_metadata(DRIVER, REF, "gpus", [GPU])

    assert direct.container_path == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/training/gpu/gpu.dra-driver.dev-metadata.json"
    )
    assert templated.container_path == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.dra-driver.dev-metadata.json"
    )
    assert "podClaimName" not in metadata_stream(direct.content)[0]
    assert all(document["podClaimName"] == "gpus" for document in metadata_stream(templated.content))


def test_each_main_request_gets_one_file_with_all_its_devices_and_a_subrequest_keeps_its_full_name() -> None:
    second = MetadataDevice(request="gpu", pool="node-a", name="gpu-1", attributes={"index": 1})
    fallback = MetadataDevice(request="small/mig", pool="node-a", name="gpu-2-mig-1g10gb-0", attributes={})
    gpus, small = request_metadata(DRIVER, REF, None, [GPU, fallback, second])

    assert (gpus.request, small.request) == ("gpu", "small")
    assert [d["name"] for d in metadata_stream(gpus.content)[0]["requests"][0]["devices"]] == [
        "gpu-0",
        "gpu-1",
    ]
    assert metadata_stream(small.content)[0]["requests"] == [
        {
            "name": "small/mig",
            "devices": [{"driver": DRIVER, "pool": "node-a", "name": "gpu-2-mig-1g10gb-0", "attributes": {}}],
        }
    ]
    assert PurePosixPath(small.container_path).parent.name == "small"
    assert small.cdi_device == "small.metadata"


def test_the_same_input_renders_the_same_bytes() -> None:
    reordered = MetadataDevice(
        request=GPU.request,
        pool=GPU.pool,
        name=GPU.name,
        attributes=dict(reversed(list(GPU.attributes.items()))),
    )
    assert request_metadata(DRIVER, REF, "gpus", [GPU]) == request_metadata(DRIVER, REF, "gpus", [reordered])


def test_the_mount_is_read_only_from_the_claims_host_file_to_the_standard_path() -> None:
    (metadata,) = request_metadata(DRIVER, REF, None, [GPU])
    edits = device_metadata.mount_edits("/var/lib/kubelet/plugins/x/dra-device-metadata", REF.uid, metadata)

    assert edits.to_json() == {
        "mounts": [
            {
                "hostPath": f"/var/lib/kubelet/plugins/x/dra-device-metadata/{REF.uid}_gpu.json",
                "containerPath": metadata.container_path,
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            }
        ]
    }


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"resource.kubernetes.io/pod-claim-name": "../../etc"}, "is not a DNS label"),
        ({"resource.kubernetes.io/pod-claim-name": "Gpus"}, "is not a DNS label"),
        ({"resource.kubernetes.io/pod-claim-name": 7}, "expected a string, got int"),
    ],
)
def test_a_pod_claim_name_that_cannot_be_a_path_component_rejects_the_claim(
    annotations: dict[str, object], message: str
) -> None:
    claim = view({"name": REF.name, "uid": REF.uid, "annotations": annotations})
    with pytest.raises(
        ClaimRejected,
        match=r"metadata\.annotations\['resource\.kubernetes\.io/pod-claim-name'\]: .*" + message,
    ):
        device_metadata.pod_claim_name(claim, REF)


def test_the_pod_claim_name_comes_from_the_annotation_of_generated_claims_only() -> None:
    annotations = {"resource.kubernetes.io/pod-claim-name": "gpus", "other": "x"}
    assert device_metadata.pod_claim_name(view({"uid": REF.uid, "annotations": annotations}), REF) == "gpus"
    assert device_metadata.pod_claim_name(view({"uid": REF.uid, "annotations": {"other": "x"}}), REF) is None
    assert device_metadata.pod_claim_name(view({"uid": REF.uid}), REF) is None


def view(metadata: dict[str, object]) -> ResourceClaimView:
    return ResourceClaimView.decode({"metadata": metadata}, "gpu.example.com")


def rendered_whole(pod_claim: str | None, devices: list[MetadataDevice]) -> list[dict[str, object]]:
    """The file's objects as the plain reading of the protocol builds them: one dictionary per API
    version, each device's attributes its published ones overridden by its facts."""
    requests: dict[str, list[dict[str, object]]] = {}
    for device in devices:
        attributes = {**device.attributes, **device.facts}
        requests.setdefault(device.request, []).append(
            {
                "driver": DRIVER,
                "pool": device.pool,
                "name": device.name,
                "attributes": {k: attribute_to_api(v) for k, v in sorted(attributes.items())},
            }
        )
    body: dict[str, object] = {
        "metadata": {"name": REF.name, "namespace": REF.namespace, "uid": REF.uid, "generation": 1}
    }
    if pod_claim:
        body["podClaimName"] = pod_claim
    body["requests"] = [{"name": name, "devices": listed} for name, listed in requests.items()]
    return [
        {"kind": "DeviceMetadata", "apiVersion": version, **body} for version in device_metadata.API_VERSIONS
    ]


ATTRIBUTE_VALUES = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.builds(Version, st.from_regex(r"[1-9][0-9]?\.[0-9]\.[0-9]", fullmatch=True)),
)
ATTRIBUTES = st.dictionaries(
    st.sampled_from(["index", "uuid", "type", "memoryLimit", "a/b"]), ATTRIBUTE_VALUES
)


@given(
    pod_claim=st.sampled_from([None, "gpus"]),
    devices=st.lists(
        st.builds(
            MetadataDevice,
            request=st.sampled_from(["gpu", "gpu/small", "other"]),
            pool=st.just("node-a"),
            name=st.sampled_from(["gpu-0", "gpu-1", "gpu-2"]),
            attributes=ATTRIBUTES,
            facts=ATTRIBUTES,
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_a_file_put_together_from_encoded_entries_is_the_whole_object_encoded(
    pod_claim: str | None, devices: list[MetadataDevice]
) -> None:
    files = request_metadata(DRIVER, REF, pod_claim, devices)
    by_main_request: dict[str, list[MetadataDevice]] = {}
    for device in devices:
        by_main_request.setdefault(device.request.split("/")[0], []).append(device)
    assert [f.request for f in files] == list(by_main_request)
    for file, listed in zip(files, by_main_request.values(), strict=True):
        expected = b"".join(compact_json(o) + b"\n" for o in rendered_whole(pod_claim, listed))
        assert file.content == expected


def test_an_entry_encoded_once_is_not_given_to_other_attributes_or_to_a_device_with_facts() -> None:
    published: dict[str, AttributeValue] = {"index": 0, "type": "gpu"}
    (first,) = request_metadata(DRIVER, REF, None, [MetadataDevice("gpu", "node-a", "gpu-0", published)])
    (again,) = request_metadata(DRIVER, REF, None, [MetadataDevice("gpu", "node-a", "gpu-0", published)])
    (other,) = request_metadata(DRIVER, REF, None, [MetadataDevice("gpu", "node-a", "gpu-0", {"index": 1})])
    (with_facts,) = request_metadata(
        DRIVER, REF, None, [MetadataDevice("gpu", "node-a", "gpu-0", published, facts={"index": 7})]
    )

    def attributes(metadata: device_metadata.RequestMetadata) -> object:
        return metadata_stream(metadata.content)[0]["requests"][0]["devices"][0]["attributes"]

    assert again.content == first.content
    assert attributes(first) == {"index": {"int": 0}, "type": {"string": "gpu"}}
    assert attributes(other) == {"index": {"int": 1}}
    assert attributes(with_facts) == {"index": {"int": 7}, "type": {"string": "gpu"}}


def test_more_attributes_than_the_api_allows_are_refused() -> None:
    crowded = MetadataDevice(
        request="gpu", pool="node-a", name="gpu-0", attributes={f"a{i}": i for i in range(33)}
    )
    with pytest.raises(ValueError, match="33 metadata attributes; the DeviceMetadata API allows 32"):
        request_metadata(DRIVER, REF, None, [crowded])


@pytest.mark.parametrize(
    ("profile", "config"),
    [
        ("dgx-h100-mig", "mig-dynamic"),
        ("mixed", "vgpu-capacity"),
        ("mixed", "vgpu-partitions"),
        ("gb200x4", "default"),
    ],
)
def test_every_published_device_with_the_facts_prepare_adds_is_a_valid_metadata_device(
    profile: str, config: str
) -> None:
    """The published attributes of each device, plus the three facts prepare may add (MIG device
    UUID, or a vGPU share's limits and share ID), stay within the API's rules."""
    prepared: dict[str, AttributeValue] = {
        "uuid": "MIG-0d1e2f30-1111-2222-3333-444455556666",
        "memoryLimit": 2**34,
        "coresLimit": 30,
        "shareID": "3f0c5e62-5b51-4b57-9e4a-2c9f1d6f4b10",
    }
    devices = [
        MetadataDevice(
            request="gpu", pool="node-a", name=device.name, attributes=device.attributes, facts=prepared
        )
        for device in inventory_for(profile, config).devices
    ]
    (metadata,) = request_metadata(DRIVER, REF, "gpus", devices)
    for document in metadata_stream(metadata.content):
        validate_metadata(document)


def test_the_schema_check_refuses_what_the_api_refuses() -> None:
    """The validator used above can fail: each broken document is refused."""
    (metadata,) = request_metadata(DRIVER, REF, None, [GPU])
    good = metadata_stream(metadata.content)[0]
    device = good["requests"][0]["devices"][0]
    broken = [
        {**good, "extra": 1},
        {**good, "apiVersion": "metadata.resource.k8s.io/v1"},
        {**good, "requests": [{"devices": []}]},
        {**good, "requests": [{"name": "gpu", "devices": [{**device, "pool": ""}]}]},
        {
            **good,
            "requests": [{"name": "gpu", "devices": [{k: v for k, v in device.items() if k != "driver"}]}],
        },
        {
            **good,
            "requests": [
                {"name": "gpu", "devices": [{**device, "attributes": {"a": {"int": 1, "bool": True}}}]}
            ],
        },
        {**good, "requests": [{"name": "gpu", "devices": [{**device, "attributes": {"a": {"float": 1.5}}}]}]},
        {**good, "metadata": {**good["metadata"], "generation": "one"}},
    ]
    for document in broken:
        with pytest.raises(jsonschema.ValidationError):
            validate_metadata(json.loads(json.dumps(document)))
