"""The opaque config API: strict decoding, its agreement with the published JSON Schema, and which
config is in force for an allocated device.

The schema in api/resource.dra-driver.dev/v1alpha1 is what users and tooling read, the decoder is
what the driver runs; hypothesis mutates valid documents field by field to find any document one
accepts and the other refuses.
"""

import contextlib
import copy
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

import kubernetes_validate
import msgspec
import msgspec.inspect as mi
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.base.strict_decode import JsonInteger
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.opaque_config import (
    API_VERSION,
    KINDS,
    ConfigEntry,
    DeviceConfig,
    GpuConfig,
    MigDeviceConfig,
    MpsSettings,
    OpaqueConfigError,
    Sharing,
    TimeSlicingSettings,
    VgpuConfig,
    api_format,
    decode_parameters,
    effective_config,
    hami_core_environment,
)
from dra_driver.devices.model import DeviceType
from tests.support.k8s_schemas import KUBERNETES_VERSIONS

REPOSITORY = Path(__file__).resolve().parents[3]
V1ALPHA1 = REPOSITORY / "api" / "resource.dra-driver.dev" / "v1alpha1"
EXAMPLES = sorted(V1ALPHA1.glob("examples/*.yaml"))
SCHEMA = Draft202012Validator(json.loads((V1ALPHA1 / "configs.schema.json").read_text()))
D = DEFAULT_DRIVER_NAME
OTHER_DRIVER = "gpu.nvidia.com"
GIB = 2**30
UUID = "4d2b8a52-1c1e-4c4c-9a55-0d1d6c1b8a01"
MPS_FIELDS = (
    "defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit"
)
QUANTITY_FORM = (
    'a whole number of bytes with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, e.g. "10Gi"'
)


def params(kind: str, **fields: object) -> dict[str, object]:
    return {"apiVersion": API_VERSION, "kind": kind, **fields}


def mps(**settings: object) -> dict[str, object]:
    return params("GpuConfig", sharing={"strategy": "MPS", "mps": settings})


def decoded_or_error(parameters: object) -> DeviceConfig | str:
    try:
        return decode_parameters(parameters)
    except OpaqueConfigError as error:
        return str(error)


# --- The published examples and the schema ------------------------------------------------------


def configs_in(document: Mapping[str, Any]) -> list[Any]:
    """The config entries of a DeviceClass, ResourceClaim or ResourceClaimTemplate."""
    if document["kind"] == "DeviceClass":
        return list(document["spec"].get("config", []))
    claim_spec = document["spec"]["spec"] if document["kind"] == "ResourceClaimTemplate" else document["spec"]
    return list(claim_spec["devices"].get("config", []))


def example_documents(path: Path) -> list[Any]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def example_parameters() -> Iterator[object]:
    for path in EXAMPLES:
        for document in example_documents(path):
            for entry in configs_in(document):
                yield entry["opaque"]["parameters"]


def test_the_schema_is_a_valid_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA.schema)


def leaf_schema(declared: mi.Type, annotation: object) -> dict[str, object]:
    """What configs.schema.json says of a field of this type; {} for a block or a header field,
    which the schema declares in a shared definition."""
    for member in declared.types if isinstance(declared, mi.UnionType) else (declared,):
        if isinstance(member, mi.BoolType):
            return {"type": "boolean"}
        if isinstance(member, mi.LiteralType):
            return {"enum": list(get_args(annotation))}
        if isinstance(member, mi.IntType):
            return {"type": "integer", "minimum": member.ge, "maximum": member.le}
        if isinstance(member, mi.CustomType) and issubclass(member.cls, JsonInteger):
            return {"type": "integer", "minimum": member.cls.minimum, "maximum": member.cls.maximum}
    return {}


def test_the_schema_has_the_declared_kinds_and_fields_with_their_types_ranges_and_defaults() -> None:
    """Each kind's format Struct in opaque_config is the one place a field is declared; the schema
    must list exactly those fields, and say of each leaf field what the declaration says."""
    definitions = SCHEMA.schema["$defs"]
    assert [choice["$ref"] for choice in SCHEMA.schema["oneOf"]] == [f"#/$defs/{kind}" for kind in KINDS]
    for kind_name, kind in KINDS.items():
        properties = definitions[kind_name]["properties"]
        api = mi.type_info(api_format(kind))
        assert isinstance(api, mi.StructType)
        assert list(properties) == [field.encode_name for field in api.fields]
        annotations = {field.name: field.type for field in msgspec.structs.fields(api_format(kind))}
        defaults = kind()
        for field in api.fields:
            expected = leaf_schema(field.type, annotations[field.name])
            said = properties[field.encode_name]
            assert {key: said.get(key) for key in expected} == expected, (kind_name, field.encode_name)
            if expected:  # a leaf field: its default is the format's and the kind's
                assert said["default"] == field.default == getattr(defaults, field.name), (
                    kind_name,
                    field.name,
                )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_every_example_is_a_valid_object_whose_configs_decode_and_satisfy_the_schema(path: Path) -> None:
    documents = example_documents(path)
    assert documents
    for document in documents:
        for kubernetes in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, kubernetes, strict=True)
        entries = configs_in(document)
        assert entries, f"{path.name}: a {document['kind']} without a config is no example of one"
        for entry in entries:
            assert entry["opaque"]["driver"] == D
            decode_parameters(entry["opaque"]["parameters"])
            SCHEMA.validate(entry["opaque"]["parameters"])


def single_example_config(name: str) -> object:
    (document,) = example_documents(V1ALPHA1 / "examples" / name)
    (entry,) = configs_in(document)
    return entry["opaque"]["parameters"]


def test_the_examples_decode_to_what_their_comments_promise() -> None:
    assert decode_parameters(single_example_config("gpu-time-slicing-claim.yaml")) == GpuConfig(
        Sharing("TimeSlicing", TimeSlicingSettings("Long"), None)
    )
    assert decode_parameters(single_example_config("gpu-mps-device-class.yaml")) == GpuConfig(
        Sharing(
            "MPS",
            None,
            MpsSettings(50, 10 * GIB, {"0": 20 * GIB, f"GPU-{UUID}": 16 * 10**9}),
        )
    )
    vgpu = decode_parameters(single_example_config("vgpu-oversubscription-claim.yaml"))
    assert vgpu == VgpuConfig(memory_oversubscription=True, core_limit_policy="Force", task_priority=0)
    assert isinstance(vgpu, VgpuConfig)
    assert hami_core_environment(vgpu) == {
        "CUDA_OVERSUBSCRIBE": "true",
        "GPU_CORE_UTILIZATION_POLICY": "force",
        "CUDA_TASK_PRIORITY": "0",
        "ACTIVE_OOM_KILLER": "false",
    }


# --- Defaults -----------------------------------------------------------------------------------

TIME_SLICING = Sharing("TimeSlicing", TimeSlicingSettings("Default"), None)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (params("GpuConfig"), GpuConfig(TIME_SLICING)),
        (params("GpuConfig", sharing={"strategy": "TimeSlicing"}), GpuConfig(TIME_SLICING)),
        (
            params("GpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {}}),
            GpuConfig(TIME_SLICING),
        ),
        (params("GpuConfig", sharing={"strategy": "MPS"}), GpuConfig(Sharing("MPS", None, MpsSettings()))),
        (mps(), GpuConfig(Sharing("MPS", None, MpsSettings(None, None, {})))),
        (params("MigDeviceConfig"), MigDeviceConfig(TIME_SLICING)),
        (params("MigDeviceConfig", sharing={"strategy": "TimeSlicing"}), MigDeviceConfig(TIME_SLICING)),
        (
            params(
                "MigDeviceConfig", sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 10}}
            ),
            MigDeviceConfig(Sharing("MPS", None, MpsSettings(default_active_thread_percentage=10))),
        ),
        (
            params("VgpuConfig"),
            VgpuConfig(
                TIME_SLICING, memory_oversubscription=False, core_limit_policy="Default", task_priority=1
            ),
        ),
        (params("VgpuConfig", sharing={"strategy": "TimeSlicing"}), VgpuConfig()),
        (params("VgpuConfig", oomKiller=True), VgpuConfig(oom_killer=True)),
        # JSON has a single number type: 50.0 is 50 (and JSON Schema counts it as an integer).
        (mps(defaultActiveThreadPercentage=50.0), GpuConfig(Sharing("MPS", None, MpsSettings(50)))),
    ],
)
def test_defaults_are_filled_in(parameters: object, expected: DeviceConfig) -> None:
    assert decode_parameters(parameters) == expected
    assert SCHEMA.is_valid(parameters)


def test_the_defaults_are_what_an_empty_config_decodes_to() -> None:
    assert GpuConfig() == decode_parameters(params("GpuConfig"))
    assert MigDeviceConfig() == decode_parameters(params("MigDeviceConfig"))
    assert VgpuConfig() == decode_parameters(params("VgpuConfig"))


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("1", 1),
        ("1073741824", GIB),
        ("1Ki", 2**10),
        ("1Mi", 2**20),
        ("10Gi", 10 * GIB),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("7Ei", 7 * 2**60),
        ("1k", 10**3),
        ("512M", 512 * 10**6),
        ("16G", 16 * 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("9E", 9 * 10**18),
        ("007Mi", 7 * 2**20),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_quantities_are_parsed_exactly(quantity: str, expected: int) -> None:
    config = decode_parameters(mps(defaultPinnedDeviceMemoryLimit=quantity))
    assert config == GpuConfig(Sharing("MPS", None, MpsSettings(default_pinned_device_memory_limit=expected)))


def test_hami_core_gets_every_variable_even_at_the_defaults() -> None:
    """HAMi-core turns its OOM killer on when ACTIVE_OOM_KILLER is unset; this API's default is off."""
    assert hami_core_environment(VgpuConfig()) == {
        "CUDA_OVERSUBSCRIBE": "false",
        "GPU_CORE_UTILIZATION_POLICY": "default",
        "CUDA_TASK_PRIORITY": "1",
        "ACTIVE_OOM_KILLER": "false",
    }
    everything = VgpuConfig(memory_oversubscription=True, core_limit_policy="Disable", oom_killer=True)
    assert hami_core_environment(everything) == {
        "CUDA_OVERSUBSCRIBE": "true",
        "GPU_CORE_UTILIZATION_POLICY": "disable",
        "CUDA_TASK_PRIORITY": "1",
        "ACTIVE_OOM_KILLER": "true",
    }


# --- Bad input, with the exact message a user sees ----------------------------------------------

NON_STRING_KEY: dict[object, object] = {"apiVersion": API_VERSION, "kind": "GpuConfig", 1: 2}
BAD_INPUTS: list[tuple[object, str]] = [
    ([params("GpuConfig")], "parameters: expected an object, got a list"),
    ({"kind": "GpuConfig"}, f"apiVersion: required; this driver's configs are {API_VERSION}"),
    (
        params("GpuConfig", apiVersion="resource.dra-driver.dev/v1"),
        f'apiVersion: "resource.dra-driver.dev/v1" is not supported; this driver reads {API_VERSION}',
    ),
    (
        params("GpuConfig", apiVersion="resource.nvidia.com/v1beta1"),
        f'apiVersion: "resource.nvidia.com/v1beta1" is not supported; this driver reads {API_VERSION}',
    ),
    ({"apiVersion": API_VERSION}, "kind: required (one of GpuConfig, MigDeviceConfig, VgpuConfig)"),
    (params("GPUConfig"), 'kind: "GPUConfig" is not one of GpuConfig, MigDeviceConfig, VgpuConfig'),
    (
        params("x" * 200),
        'kind: "' + "x" * 80 + '"... (200 characters) is not one of GpuConfig, MigDeviceConfig, VgpuConfig',
    ),
    (params("GpuConfig", shareing={}), "shareing: unknown field (allowed here: apiVersion, kind, sharing)"),
    (
        params("GpuConfig", oomKiller=True),
        "oomKiller: unknown field (allowed here: apiVersion, kind, sharing)",
    ),
    (
        mps(defaultActiveThreadPercentage=50, pinnedLimit="1Gi"),
        f"sharing.mps.pinnedLimit: unknown field (allowed here: {MPS_FIELDS})",
    ),
    (
        params(
            "GpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long", "length": 1}}
        ),
        "sharing.timeSlicing.length: unknown field (allowed here: interval)",
    ),
    (
        params("GpuConfig", sharing={"strategy": "MPS", "mps": {"bad\nname": 1}}),
        f'sharing.mps."bad\\nname": unknown field (allowed here: {MPS_FIELDS})',
    ),
    (
        params("GpuConfig", sharing="MPS"),
        'sharing: expected an object with fields strategy, timeSlicing, mps, got the string "MPS"',
    ),
    (
        params("GpuConfig", sharing=None),
        "sharing: expected an object with fields strategy, timeSlicing, mps, got null",
    ),
    (params("GpuConfig", sharing={}), "sharing.strategy: required (one of TimeSlicing, MPS)"),
    (
        params("GpuConfig", sharing={"strategy": "Timeslicing"}),
        'sharing.strategy: "Timeslicing" is not one of TimeSlicing, MPS',
    ),
    (
        params("GpuConfig", sharing={"strategy": 1}),
        "sharing.strategy: expected one of TimeSlicing, MPS, got the integer 1",
    ),
    (
        params("GpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "long"}}),
        'sharing.timeSlicing.interval: "long" is not one of Default, Short, Medium, Long',
    ),
    (
        params("GpuConfig", sharing={"strategy": "MPS", "timeSlicing": {"interval": "Long"}}),
        "sharing.timeSlicing: only allowed with strategy TimeSlicing (strategy is MPS)",
    ),
    (
        params("GpuConfig", sharing={"strategy": "TimeSlicing", "mps": {}}),
        "sharing.mps: only allowed with strategy MPS (strategy is TimeSlicing)",
    ),
    (
        mps(defaultActiveThreadPercentage=True),
        "sharing.mps.defaultActiveThreadPercentage: expected an integer from 1 to 100, got true",
    ),
    (
        mps(defaultActiveThreadPercentage="50"),
        'sharing.mps.defaultActiveThreadPercentage: expected an integer from 1 to 100, got the string "50"',
    ),
    (
        mps(defaultActiveThreadPercentage=50.5),
        "sharing.mps.defaultActiveThreadPercentage: expected an integer from 1 to 100, got the number 50.5",
    ),
    (
        mps(defaultActiveThreadPercentage=0),
        "sharing.mps.defaultActiveThreadPercentage: 0 is out of range; expected an integer from 1 to 100",
    ),
    (
        mps(defaultActiveThreadPercentage=101),
        "sharing.mps.defaultActiveThreadPercentage: 101 is out of range; expected an integer from 1 to 100",
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="10GB"),
        f'sharing.mps.defaultPinnedDeviceMemoryLimit: "10GB" is not {QUANTITY_FORM}',
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="1e9"),
        f'sharing.mps.defaultPinnedDeviceMemoryLimit: "1e9" is not {QUANTITY_FORM}',
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit=" 10Gi"),
        f'sharing.mps.defaultPinnedDeviceMemoryLimit: " 10Gi" is not {QUANTITY_FORM}',
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="1.5Gi"),
        'sharing.mps.defaultPinnedDeviceMemoryLimit: "1.5Gi" has a fraction; '
        "write it in a smaller unit, e.g. 1536Mi for 1.5Gi",
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="-1Gi"),
        'sharing.mps.defaultPinnedDeviceMemoryLimit: "-1Gi" is negative; '
        "a memory limit must be more than zero",
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="0Gi"),
        'sharing.mps.defaultPinnedDeviceMemoryLimit: "0Gi" is zero; a memory limit must be more than zero',
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit=1073741824),
        f"sharing.mps.defaultPinnedDeviceMemoryLimit: expected a quantity string, {QUANTITY_FORM}; "
        "got the integer 1073741824",
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="8Ei"),
        'sharing.mps.defaultPinnedDeviceMemoryLimit: "8Ei" is more than 9223372036854775807 bytes (2^63 - 1)',
    ),
    (
        mps(defaultPinnedDeviceMemoryLimit="9" * 5000),
        'sharing.mps.defaultPinnedDeviceMemoryLimit: "' + "9" * 80 + '"... (5000 characters) '
        "is more than 9223372036854775807 bytes (2^63 - 1)",
    ),
    (
        mps(defaultPerDevicePinnedMemoryLimit={"0": "1Gi", "1": "0"}),
        'sharing.mps.defaultPerDevicePinnedMemoryLimit["1"]: "0" is zero; '
        "a memory limit must be more than zero",
    ),
    (
        mps(defaultPerDevicePinnedMemoryLimit={"gpu0": "1Gi"}),
        'sharing.mps.defaultPerDevicePinnedMemoryLimit: key "gpu0" is neither a device index (0, 1, ...) '
        "nor a GPU or MIG UUID (GPU-<uuid>, MIG-<uuid>, lowercase)",
    ),
    (
        mps(defaultPerDevicePinnedMemoryLimit={f"GPU-{UUID.upper()}": "1Gi"}),
        f'sharing.mps.defaultPerDevicePinnedMemoryLimit: key "GPU-{UUID.upper()}" is neither a device index '
        "(0, 1, ...) nor a GPU or MIG UUID (GPU-<uuid>, MIG-<uuid>, lowercase)",
    ),
    (
        mps(defaultPerDevicePinnedMemoryLimit=["1Gi"]),
        "sharing.mps.defaultPerDevicePinnedMemoryLimit: "
        "expected an object of device index or UUID to quantity, got a list",
    ),
    # YAML, unlike JSON, can give a mapping integer keys: quoting them is the fix.
    (
        mps(defaultPerDevicePinnedMemoryLimit={0: "1Gi"}),
        "sharing.mps.defaultPerDevicePinnedMemoryLimit: key the integer 0 is neither a device index "
        "(0, 1, ...) nor a GPU or MIG UUID (GPU-<uuid>, MIG-<uuid>, lowercase)",
    ),
    (NON_STRING_KEY, "parameters: field names are strings, got the integer 1"),
    (
        params("MigDeviceConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        "sharing.timeSlicing: not supported for a MIG device: "
        "the time slice is a setting of the whole GPU, which every MIG device on it shares",
    ),
    (
        params("VgpuConfig", sharing={"strategy": "MPS"}),
        "sharing.strategy: MPS is not supported for a vGPU (allowed: TimeSlicing): "
        "MPS changes the compute mode of the whole GPU, which other claims share",
    ),
    (
        params("VgpuConfig", sharing={"strategy": "TimeSlicing", "mps": {}}),
        "sharing.mps: not supported for a vGPU: MPS changes the compute mode of the whole GPU, "
        "which other claims share",
    ),
    (
        params("VgpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}),
        "sharing.timeSlicing: not supported for a vGPU: "
        "the time slice is a setting of the whole GPU, which other claims share",
    ),
    (
        params("VgpuConfig", memoryOversubscription="true"),
        'memoryOversubscription: expected true or false, got the string "true"',
    ),
    (params("VgpuConfig", oomKiller=1), "oomKiller: expected true or false, got the integer 1"),
    (
        params("VgpuConfig", coreLimitPolicy="force"),
        'coreLimitPolicy: "force" is not one of Default, Force, Disable',
    ),
    (
        params("VgpuConfig", taskPriority=2),
        "taskPriority: 2 is out of range; expected an integer from 0 to 1",
    ),
    (
        params("VgpuConfig", taskPriority=-1),
        "taskPriority: -1 is out of range; expected an integer from 0 to 1",
    ),
    (params("VgpuConfig", taskPriority=False), "taskPriority: expected an integer from 0 to 1, got false"),
    (
        params("VgpuConfig", taskPriority=10**400),
        "taskPriority: a number of more than 77 digits is out of range; expected an integer from 0 to 1",
    ),
    (
        params("VgpuConfig", taskPriority=float("nan")),
        "taskPriority: expected an integer from 0 to 1, got the number nan",
    ),
]


@pytest.mark.parametrize(("parameters", "message"), BAD_INPUTS)
def test_bad_input_is_refused_with_a_message_naming_the_field(parameters: object, message: str) -> None:
    with pytest.raises(OpaqueConfigError) as raised:
        decode_parameters(parameters)
    assert str(raised.value) == message
    if not beyond_the_schema(parameters):
        assert not SCHEMA.is_valid(parameters)


def test_a_bad_config_is_a_rejected_claim() -> None:
    """The engine already turns ClaimRejected into that claim's error; nothing else is needed."""
    assert issubclass(OpaqueConfigError, ClaimRejected)


# --- Which config is in force -------------------------------------------------------------------


def claim(*configs: object) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [], "config": list(configs)}}}}


def entry(source: str, parameters: object, requests: tuple[str, ...] = (), driver: str = D) -> dict[str, Any]:
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {"driver": driver, "parameters": parameters},
    }


def gpu_interval(interval: str) -> dict[str, object]:
    return params("GpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}})


def decoded_config(document: dict[str, Any]) -> tuple[ConfigEntry, ...]:
    """The config entries of a claim document, decoded as prepare decodes the claim."""
    return ResourceClaimView.decode({"metadata": {"uid": "c-uid"}, **document}, D).config


def resolved(
    configs: list[dict[str, Any]], request: str = "gpu", device_type: DeviceType = "gpu"
) -> DeviceConfig | str:
    try:
        return effective_config(decoded_config(claim(*configs)), D, request, device_type)
    except OpaqueConfigError as error:
        return str(error)


def interval_of(config: DeviceConfig | str) -> str:
    assert isinstance(config, GpuConfig), config
    assert config.sharing.time_slicing is not None
    return config.sharing.time_slicing.interval


@pytest.mark.parametrize("device_type", ["gpu", "mig", "vgpu"])
def test_without_applicable_config_the_device_types_defaults_apply(device_type: DeviceType) -> None:
    defaults = {"gpu": GpuConfig(), "mig": MigDeviceConfig(), "vgpu": VgpuConfig()}
    assert resolved([], device_type=device_type) == defaults[device_type]
    assert effective_config(decoded_config({}), D, "gpu", device_type) == defaults[device_type]
    only_others = [entry("FromClaim", params("GpuConfig"), requests=("other",))]
    assert resolved(only_others, device_type=device_type) == defaults[device_type]


def test_claim_configs_win_over_class_configs_whatever_their_order_in_the_list() -> None:
    class_config = entry("FromClass", gpu_interval("Short"))
    claim_config = entry("FromClaim", gpu_interval("Long"))
    assert interval_of(resolved([class_config, claim_config])) == "Long"
    assert interval_of(resolved([claim_config, class_config])) == "Long"


def test_within_a_source_the_later_entry_wins() -> None:
    assert (
        interval_of(resolved([entry("FromClass", gpu_interval(i)) for i in ("Short", "Medium")])) == "Medium"
    )
    assert (
        interval_of(resolved([entry("FromClaim", gpu_interval(i)) for i in ("Medium", "Short")])) == "Short"
    )


def test_the_winner_replaces_earlier_configs_whole_never_field_by_field() -> None:
    class_config = entry(
        "FromClass", params("VgpuConfig", oomKiller=True, memoryOversubscription=True, taskPriority=0)
    )
    claim_config = entry("FromClaim", params("VgpuConfig", coreLimitPolicy="Force"))
    assert resolved([class_config, claim_config], device_type="vgpu") == VgpuConfig(core_limit_policy="Force")
    limited = entry("FromClass", mps(defaultActiveThreadPercentage=20, defaultPinnedDeviceMemoryLimit="1Gi"))
    plain_mps = entry("FromClaim", params("GpuConfig", sharing={"strategy": "MPS"}))
    assert resolved([limited, plain_mps]) == GpuConfig(Sharing("MPS", None, MpsSettings()))


@pytest.mark.parametrize(
    ("requests", "result_request", "applies"),
    [
        ((), "gpu", True),
        ((), "accelerator/mig", True),
        (("gpu",), "gpu", True),
        (("gpu", "other"), "gpu", True),
        (("other",), "gpu", False),
        (("accelerator",), "accelerator/mig", True),
        (("accelerator/mig",), "accelerator/mig", True),
        (("accelerator/gpu",), "accelerator/mig", False),
        (("accelerator/mig",), "accelerator", False),
        (("accel",), "accelerator/mig", False),
    ],
)
def test_an_entry_applies_to_its_requests_and_a_subrequest_to_its_parent(
    requests: tuple[str, ...], result_request: str, applies: bool
) -> None:
    configs = [entry("FromClaim", gpu_interval("Long"), requests=requests)]
    assert interval_of(resolved(configs, request=result_request)) == ("Long" if applies else "Default")


def test_entries_for_other_drivers_are_ignored_even_when_they_would_not_decode() -> None:
    configs = [
        entry("FromClaim", gpu_interval("Long")),
        entry(
            "FromClaim",
            {"kind": "GpuConfig", "apiVersion": "resource.nvidia.com/v1beta1"},
            driver=OTHER_DRIVER,
        ),
        entry("FromClaim", "not even an object", driver=OTHER_DRIVER),
    ]
    assert interval_of(resolved(configs)) == "Long"


def test_a_config_of_the_wrong_kind_names_the_entry_the_request_and_the_kinds_that_fit() -> None:
    configs = [
        entry("FromClass", params("MigDeviceConfig")),
        entry("FromClaim", params("GpuConfig"), requests=("accelerator",)),
    ]
    assert resolved(configs, request="accelerator/mig", device_type="mig") == (
        "status.allocation.devices.config[1] (FromClaim): "
        'a GpuConfig does not fit request "accelerator/mig", which was allocated a mig device; '
        "it takes a MigDeviceConfig "
        "(gpu → GpuConfig, mig → MigDeviceConfig, vgpu → VgpuConfig)"
    )
    assert resolved([entry("FromClass", params("VgpuConfig"))], device_type="gpu") == (
        'status.allocation.devices.config[0] (FromClass): a VgpuConfig does not fit request "gpu", '
        "which was allocated a gpu device; it takes a GpuConfig "
        "(gpu → GpuConfig, mig → MigDeviceConfig, vgpu → VgpuConfig)"
    )


def test_only_the_winner_must_fit_the_device_type() -> None:
    """A claim-wide GpuConfig narrowed by a MigDeviceConfig for the MIG request is a fine claim."""
    configs = [
        entry("FromClaim", params("GpuConfig")),
        entry("FromClaim", params("MigDeviceConfig"), requests=("mig",)),
    ]
    assert resolved(configs, request="mig", device_type="mig") == MigDeviceConfig()
    assert resolved(configs, request="gpu", device_type="gpu") == GpuConfig()


def test_a_broken_entry_is_reported_with_its_position_and_source_even_if_a_later_one_wins() -> None:
    configs = [
        entry("FromClaim", gpu_interval("Long")),
        entry("FromClass", params("GpuConfig", sharing={"strategy": "Timeslicing"})),
    ]
    assert resolved(configs) == (
        'status.allocation.devices.config[1] (FromClass): sharing.strategy: "Timeslicing" is not one of '
        "TimeSlicing, MPS"
    )
    unrelated = [
        entry("FromClaim", gpu_interval("Bogus"), requests=("other",)),
        entry("FromClaim", gpu_interval("Long")),
    ]
    assert interval_of(resolved(unrelated)) == "Long"


def test_the_first_available_example_resolves_per_subrequest() -> None:
    (document,) = example_documents(V1ALPHA1 / "examples" / "mig-or-gpu-first-available-claim.yaml")
    allocated = claim(*({"source": "FromClaim", **config} for config in configs_in(document)))
    entries = decoded_config(allocated)
    assert effective_config(entries, D, "accelerator/mig", "mig") == MigDeviceConfig(
        Sharing("MPS", None, MpsSettings(default_active_thread_percentage=25))
    )
    assert effective_config(entries, D, "accelerator/gpu", "gpu") == GpuConfig(
        Sharing("TimeSlicing", TimeSlicingSettings("Short"), None)
    )


def test_the_claims_configs_are_decoded_in_order_skipping_non_opaque_entries() -> None:
    allocated = claim(
        entry("FromClass", params("GpuConfig")),
        {"source": "FromClaim", "requests": ["a"]},
        {
            "source": "FromClaim",
            "requests": ["b", "c/d"],
            "opaque": {"driver": OTHER_DRIVER, "parameters": 7},
        },
        {"source": "FromClaim", "opaque": {"driver": D, "parameters": {}}},
    )
    assert decoded_config(allocated) == (
        ConfigEntry(0, "FromClass", (), D, params("GpuConfig")),
        ConfigEntry(2, "FromClaim", ("b", "c/d"), OTHER_DRIVER, 7),
        ConfigEntry(3, "FromClaim", (), D, {}),
    )
    assert decoded_config({"status": {}}) == ()
    assert decoded_config(claim()) == ()


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ("x", 'status.allocation.devices.config: expected a list, got the string "x"'),
        (["x"], 'status.allocation.devices.config[0]: expected an object, got the string "x"'),
        (
            [{"source": "FromPod", "opaque": {"driver": D, "parameters": {}}}],
            'status.allocation.devices.config[0].source: "FromPod" is not one of FromClass, FromClaim',
        ),
        (
            [{"opaque": {"driver": D, "parameters": {}}}],
            "status.allocation.devices.config[0].source: expected one of FromClass, FromClaim, got null",
        ),
        (
            [{"source": "FromClaim", "requests": "gpu", "opaque": {"driver": D}}],
            "status.allocation.devices.config[0].requests: "
            'expected a list of request names, got the string "gpu"',
        ),
        (
            [{"source": "FromClaim", "opaque": {"parameters": {}}}],
            "status.allocation.devices.config[0].opaque.driver: expected a string, got null",
        ),
        (
            [{"source": "FromClaim", "opaque": []}],
            "status.allocation.devices.config[0].opaque: expected an object, got a list",
        ),
    ],
)
def test_malformed_allocation_configs_are_refused_with_their_path(configs: object, message: str) -> None:
    with pytest.raises(OpaqueConfigError) as raised:
        decoded_config({"status": {"allocation": {"devices": {"config": configs}}}})
    assert str(raised.value) == message


# --- Properties ---------------------------------------------------------------------------------

INTERVALS = ["Default", "Short", "Medium", "Long"]
REQUEST_NAMES = ["gpu", "mig", "accelerator", "accelerator/mig", "accelerator/gpu"]


@given(
    configs=st.lists(
        st.tuples(
            st.sampled_from(["FromClass", "FromClaim"]),
            st.lists(st.sampled_from(REQUEST_NAMES), max_size=2),
            st.sampled_from([D, OTHER_DRIVER]),
            st.sampled_from(INTERVALS),
        ),
        max_size=8,
    ),
    request=st.sampled_from(REQUEST_NAMES),
)
def test_the_effective_config_is_the_last_applicable_one_with_class_entries_first(
    configs: list[tuple[str, list[str], str, str]], request: str
) -> None:
    applicable = [
        interval
        for source, requests, driver, interval in (
            [c for c in configs if c[0] == "FromClass"] + [c for c in configs if c[0] == "FromClaim"]
        )
        if driver == D and (not requests or request in requests or request.split("/", 1)[0] in requests)
    ]
    raw = [entry(source, gpu_interval(i), tuple(requests), driver) for source, requests, driver, i in configs]
    assert interval_of(resolved(raw, request=request)) == (applicable[-1] if applicable else "Default")


FIELD_NAMES = [
    "apiVersion",
    "kind",
    "sharing",
    "strategy",
    "timeSlicing",
    "interval",
    "mps",
    *MPS_FIELDS.split(", "),
    "memoryOversubscription",
    "coreLimitPolicy",
    "taskPriority",
    "oomKiller",
    "0",
    f"GPU-{UUID}",
    f"MIG-{UUID}",
    "unknown",
]
INTERESTING_VALUES: list[object] = [
    API_VERSION,
    "resource.dra-driver.dev/v1",
    "GpuConfig",
    "MigDeviceConfig",
    "VgpuConfig",
    "TimeSlicing",
    "MPS",
    "Timeslicing",
    *INTERVALS,
    "Force",
    "Disable",
    "force",
    0,
    1,
    2,
    -1,
    50,
    100,
    101,
    1.0,
    50.5,
    True,
    False,
    None,
    "1",
    "0",
    "0Gi",
    "10Gi",
    "512M",
    "1.5Gi",
    "-1Gi",
    "10GB",
    "1e3",
    "7Ei",
    "8Ei",
    "99999999999999999999Ki",
    "10Gi\n",
    {},
    [],
    {"strategy": "MPS"},
    {"strategy": "TimeSlicing"},
    {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
    {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}},
    {"interval": "Medium"},
    {"defaultActiveThreadPercentage": 10, "defaultPinnedDeviceMemoryLimit": "2Gi"},
    {"0": "1Gi", f"GPU-{UUID}": "2G"},
    {f"MIG-{UUID}": "1Gi"},
    {"0\n": "1Gi"},
]
VALID_DOCUMENTS: list[object] = [
    *example_parameters(),
    params("GpuConfig"),
    params("GpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicing": {}}),
    mps(
        defaultActiveThreadPercentage=100,
        defaultPinnedDeviceMemoryLimit="1",
        defaultPerDevicePinnedMemoryLimit={"0": "1Gi", "12": "3G", f"MIG-{UUID}": "1Ki"},
    ),
    params("MigDeviceConfig", sharing={"strategy": "TimeSlicing"}),
    params("MigDeviceConfig", sharing={"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "5Gi"}}),
    params(
        "VgpuConfig",
        sharing={"strategy": "TimeSlicing"},
        memoryOversubscription=False,
        coreLimitPolicy="Disable",
        taskPriority=1,
        oomKiller=True,
    ),
]

json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
values = st.sampled_from(INTERESTING_VALUES).map(copy.deepcopy) | json_like


def objects_in(document: object) -> Iterator[dict[Any, Any]]:
    if isinstance(document, dict):
        yield document
        for value in document.values():
            yield from objects_in(value)
    elif isinstance(document, list):
        for value in document:
            yield from objects_in(value)


@st.composite
def mutated_documents(draw: st.DrawFn) -> object:
    """A valid document with one to three fields dropped, added or replaced, at any depth."""
    document = copy.deepcopy(draw(st.sampled_from(VALID_DOCUMENTS)))
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(list(objects_in(document))))
        action = draw(st.sampled_from(["drop", "replace", "add"]) if target else st.just("add"))
        if action == "add":
            target[draw(st.sampled_from(FIELD_NAMES) | st.text(max_size=8))] = draw(values)
            continue
        key = draw(st.sampled_from(sorted(target)))
        if action == "drop":
            del target[key]
        else:
            target[key] = draw(values)
    return document


# Documents shaped like configs, so random values reach every field, not just the header.
shaped_documents = st.fixed_dictionaries(
    {
        "apiVersion": st.just(API_VERSION),
        "kind": st.sampled_from(["GpuConfig", "MigDeviceConfig", "VgpuConfig"]),
    },
    optional=dict.fromkeys(("sharing", "memoryOversubscription", "coreLimitPolicy", "taskPriority"), values),
)
# What YAML can hold beyond JSON: non-string keys, huge integers.
yaml_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=8) | st.integers() | st.booleans() | st.none(), children, max_size=4
        )
    ),
    max_leaves=12,
)


@given(st.one_of(json_like, yaml_like, mutated_documents(), shaped_documents))
def test_any_input_either_decodes_or_raises_opaque_config_error(parameters: object) -> None:
    result = decoded_or_error(parameters)
    assert isinstance(result, GpuConfig | MigDeviceConfig | VgpuConfig | str)


@given(st.lists(st.one_of(yaml_like, st.builds(entry, st.sampled_from(["FromClass", "FromClaim"]), values))))
def test_any_allocation_config_either_resolves_or_raises_opaque_config_error(configs: list[object]) -> None:
    with contextlib.suppress(OpaqueConfigError):
        effective_config(decoded_config(claim(*configs)), D, "gpu", "gpu")


_QUANTITY = re.compile(r"0*([1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_FACTORS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_FACTORS |= {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def beyond_the_schema(document: object) -> bool:
    """Documents on which the schema cannot agree with the decoder; the decoder refuses them all.

    - a quantity above 2^63 - 1 bytes: a regular expression cannot bound a number;
    - a string ending in a newline: jsonschema runs `pattern` with Python's re.search, where `$`
      also matches before a final newline (ECMA-262 regular expressions, which JSON Schema
      specifies, do not), so "10Gi\\n" passes the schema's quantity pattern;
    - a non-string key: JSON has none, YAML does, and jsonschema skips them in propertyNames.
    Every string in an accepted document is a field name, an enum value, a device key or a
    quantity, and none of those may end in a newline or be too large, so the decoder refuses these.
    """
    if isinstance(document, list):
        return any(beyond_the_schema(value) for value in document)
    if isinstance(document, dict):
        return any(
            not isinstance(key, str) or key.endswith("\n") or beyond_the_schema(value)
            for key, value in document.items()
        )
    if isinstance(document, str):
        match = _QUANTITY.fullmatch(document)
        too_large = match is not None and (
            len(match[1]) > 19 or int(match[1]) * _FACTORS[match[2] or ""] > 2**63 - 1
        )
        return too_large or document.endswith("\n")
    return False


@given(st.one_of(mutated_documents(), shaped_documents))
def test_the_decoder_accepts_exactly_what_the_schema_accepts(document: object) -> None:
    result = decoded_or_error(document)
    if beyond_the_schema(document):
        assert isinstance(result, str), result
    else:
        assert SCHEMA.is_valid(document) == (not isinstance(result, str)), result


def test_the_exclusions_from_the_agreement_are_real_disagreements() -> None:
    """If jsonschema or the schema changes so that these agree, the exclusions above can go."""
    for document in (mps(defaultPinnedDeviceMemoryLimit="8Ei"), mps(defaultPinnedDeviceMemoryLimit="10Gi\n")):
        assert SCHEMA.is_valid(document)
        assert isinstance(decoded_or_error(document), str)


# A value for each JSON type and one valid value of each field's type: an added field meets these
# (every interesting value would triple the test's time for no new case).
ADDED_VALUES: list[object] = [
    None,
    True,
    1,
    101,
    1.5,
    "x",
    "MPS",
    "Long",
    "Force",
    "10Gi",
    [],
    {},
    {"strategy": "MPS"},
    {"interval": "Medium"},
    {"defaultActiveThreadPercentage": 10},
    {"0": "1Gi"},
]
DROP = object()


def single_mutations(document: object) -> Iterator[object]:
    """Every document one edit away from `document`: each field dropped or set to each interesting
    value, and each known field name missing from an object added with each added value."""
    for index, target in enumerate(objects_in(document)):
        edits = [(key, value) for key in target for value in [DROP, *INTERESTING_VALUES]]
        edits += [(name, value) for name in FIELD_NAMES if name not in target for value in ADDED_VALUES]
        for key, value in edits:
            mutated = copy.deepcopy(document)
            node = list(objects_in(mutated))[index]
            if value is DROP:
                del node[key]
            else:
                node[key] = copy.deepcopy(value)
            yield mutated


def test_every_single_edit_of_a_valid_document_gets_the_same_verdict_from_decoder_and_schema() -> None:
    """Exhaustive where hypothesis samples: one edit is where a forgotten rule shows first."""
    disagreements: list[tuple[object, object]] = []
    for document in VALID_DOCUMENTS:
        for mutated in single_mutations(document):
            result = decoded_or_error(mutated)
            if beyond_the_schema(mutated):
                if not isinstance(result, str):
                    disagreements.append((mutated, "accepted beyond the schema"))
            elif SCHEMA.is_valid(mutated) == isinstance(result, str):
                disagreements.append((mutated, result))
    assert not disagreements, disagreements[:5]
