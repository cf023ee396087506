"""The DeviceClasses, and the CEL their selectors (and users' selectors) are written in.

Selectors are evaluated by the real CEL engine (tests/support/cel.py) against hand-built v1
Devices shaped like the driver's, plus devices of other drivers, because a class selector runs
against every device in the cluster and a single runtime error aborts a claim's allocation.
"""

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.opaque_config import GpuConfig, decode_parameters
from dra_driver.devices.classes import SHARING_CLASSES, device_classes, device_classes_yaml, main
from dra_driver.devices.extended_resources import ExtendedResources, catalog_mig_profiles
from dra_driver.kube.k8s_names import dns_subdomain_problem
from tests.support.cel import CelCompileError, CelEvaluationError, parse_quantity, selects
from tests.support.k8s_schemas import KUBERNETES_VERSIONS

REPOSITORY = Path(__file__).resolve().parents[2]
OTHER_DRIVER_NAME = "gpu.example.com"
D = DEFAULT_DRIVER_NAME

# --- Devices as the driver publishes them (resource.k8s.io/v1 Device objects) ------------------

WHOLE_GPU: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "architecture": {"string": "Hopper"},
        "brand": {"string": "Nvidia"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "index": {"int": 0},
        "minor": {"int": 0},
        "numaNode": {"int": 0},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "type": {"string": "gpu"},
        "uuid": {"string": "GPU-4d2b8a52-1c1e-4c4c-9a55-0d1d6c1b8a01"},
    },
    "capacity": {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
}
MIG: dict[str, Any] = {
    "name": "gpu-1-mig-1g-5gb-0",
    "attributes": {
        "architecture": {"string": "Ampere"},
        "brand": {"string": "Nvidia"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "parentUUID": {"string": "GPU-7f0c2e11-5a9b-4e3d-8c21-2b6f0e9d4c02"},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "profile": {"string": "1g.5gb"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "type": {"string": "mig"},
        "uuid": {"string": "MIG-0e5d3c2b-9a8f-5e7d-b6c5-4a3b2c1d0e03"},
    },
    "capacity": {"memory": {"value": "4864Mi"}, "multiprocessors": {"value": "14"}},
}
SHARED_VGPU: dict[str, Any] = {
    "name": "gpu-2-vgpu",
    "attributes": {
        "cudaComputeCapability": {"version": "8.9.0"},
        "productName": {"string": "NVIDIA L40S"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:40"},
        "type": {"string": "vgpu"},
    },
    "capacity": {
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "10", "validRange": {"min": "5", "max": "100", "step": "5"}},
        },
        "memory": {
            "value": "46068Mi",
            "requestPolicy": {
                "default": "4Gi",
                "validRange": {"min": "1Gi", "max": "46068Mi", "step": "1Gi"},
            },
        },
    },
    "allowMultipleAllocations": True,
}
PARTITION_VGPU: dict[str, Any] = {
    "name": "gpu-3-vgpu-0",
    "attributes": {
        "cudaComputeCapability": {"version": "8.6.0"},
        "productName": {"string": "NVIDIA A10"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:80"},
        "type": {"string": "vgpu"},
    },
    "capacity": {"cores": {"value": "25"}, "memory": {"value": "20096Mi"}},
}
OUR_DEVICES = [WHOLE_GPU, MIG, SHARED_VGPU, PARTITION_VGPU]
TYPES = {"gpu-0": "gpu", "gpu-1-mig-1g-5gb-0": "mig", "gpu-2-vgpu": "vgpu", "gpu-3-vgpu-0": "vgpu"}

# Another vendor's GPU, with a `type` attribute in its own domain, and a device that publishes a
# `type` in our domain: only the driver check tells either apart from ours.
FOREIGN_GPU: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {"type": {"string": "gpu"}, "model": {"string": "Instinct MI300X"}},
    "capacity": {"memory": {"value": "192Gi"}},
}
IMPOSTOR: dict[str, Any] = {
    "name": "nic-0",
    "attributes": {f"{D}/type": {"string": "gpu"}, f"{OTHER_DRIVER_NAME}/type": {"string": "gpu"}},
}
FOREIGN = [("gpu.other-vendor.example", FOREIGN_GPU), ("nic.example.net", IMPOSTOR)]


def every_device() -> list[tuple[str, dict[str, Any]]]:
    """Our devices under both driver names, and the foreign ones: what a cluster's scheduler sees."""
    ours = [(driver, device) for driver in (D, OTHER_DRIVER_NAME) for device in OUR_DEVICES]
    return ours + FOREIGN


def resource_slice(driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-slice"},
        "spec": {
            "driver": driver,
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
def test_the_hand_built_devices_are_valid_v1_devices(kubernetes: str) -> None:
    """Otherwise the selector tests below would prove things about devices that cannot exist."""
    kubernetes_validate.validate(resource_slice(D, OUR_DEVICES), kubernetes, strict=True)
    for driver, device in FOREIGN:
        kubernetes_validate.validate(resource_slice(driver, [device]), kubernetes, strict=True)


# --- The DeviceClass objects ------------------------------------------------------------------


def test_the_committed_device_classes_are_the_default_rendering() -> None:
    committed = (REPOSITORY / "deploy" / "deviceclasses.yaml").read_text()

    assert committed == device_classes_yaml(DEFAULT_DRIVER_NAME), (
        "deploy/deviceclasses.yaml is stale: python -m dra_driver.devices.classes > deploy/deviceclasses.yaml"
    )
    assert list(yaml.safe_load_all(committed)) == device_classes(DEFAULT_DRIVER_NAME)


def test_the_module_prints_the_rendering_for_the_options_given(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--driver-name", OTHER_DRIVER_NAME, "--extended-resources", "--kubernetes-version", "1.37"]
    assert main([*flags, "--extended-mig-profile", "2g.20gb", "--extended-mig-profile", "1g.10gb"]) == 0

    printed = capsys.readouterr().out
    assert printed == device_classes_yaml(OTHER_DRIVER_NAME, ExtendedResources(("1g.10gb", "2g.20gb")))
    assert printed.splitlines()[2].endswith(
        "--driver-name gpu.example.com --extended-resources --kubernetes-version 1.36 "
        "--extended-mig-profile 1g.10gb --extended-mig-profile 2g.20gb"
    )


def test_the_module_serves_every_catalog_profile_unless_told_which(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--extended-resources", "--kubernetes-version", "1.36"]) == 0

    printed = capsys.readouterr().out
    assert printed == device_classes_yaml(D, ExtendedResources(catalog_mig_profiles()))
    assert printed.splitlines()[2].endswith("--extended-resources --kubernetes-version 1.36")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--extended-resources"], "--extended-resources: needs Kubernetes 1.36 or later"),
        (["--extended-resources", "--kubernetes-version", "1.35"], "DRAExtendedResource"),
        (["--kubernetes-version", "1.33"], "--kubernetes-version: 1.33 is not supported"),
        (["--extended-mig-profile", "1g.10gb"], "--extended-mig-profile: only with --extended-resources"),
        (
            ["--extended-resources", "--kubernetes-version", "1.36", "--extended-mig-profile", "1g.10gb+x"],
            "--extended-mig-profile: '1g.10gb+x' is not a MIG profile name",
        ),
    ],
)
def test_the_module_refuses_extended_resources_it_cannot_serve(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)

    assert exit_info.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert message in line


def test_the_module_refuses_a_driver_name_that_is_not_a_dns_subdomain() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--driver-name", 'gpu" || true || "'])
    assert exit_info.value.code == 2


_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def extended_resource_name_problem(name: str) -> str | None:
    """The API server's rule for an extended resource name (IsExtendedResourceName in
    k8s.io/kubernetes pkg/apis/core/helper, applied to DeviceClass.spec.extendedResourceName):
    a domain outside kubernetes.io, and `requests.<name>` a qualified name (so the name part is
    at most 63 characters of letters, digits, '-', '_' and '.')."""
    domain, slash, rest = name.partition("/")
    if not slash or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"{name!r} is not in a domain of its own"
    if dns_subdomain_problem(domain) is not None:
        return f"{name!r}: domain is not a DNS subdomain"
    if len(rest) > 63 or not _QUALIFIED_NAME_PART.fullmatch(rest):
        return f"{name!r}: name part is not a qualified name"
    return None


def test_the_extended_resource_name_rule_refuses_what_the_api_server_refuses() -> None:
    assert extended_resource_name_problem("nvidia.com/mig-1g.10gb+me") is not None
    assert extended_resource_name_problem("kubernetes.io/gpu") is not None
    assert extended_resource_name_problem("gpu") is not None
    assert extended_resource_name_problem("nvidia.com/mig-1g.10gb.me") is None


# Every catalog profile (suffixes included) and partition sizes in every spelling quantity() has.
EVERYTHING_EXTENDED = ExtendedResources(
    catalog_mig_profiles(), (512 * 2**20, 10 * 2**30, 1536 * 2**20, 2**40)
)


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("driver", [D, OTHER_DRIVER_NAME])
def test_every_device_class_is_valid(kubernetes: str, driver: str) -> None:
    for device_class in device_classes(driver):
        kubernetes_validate.validate(device_class, kubernetes, strict=True)


@pytest.mark.parametrize("kubernetes", ["1.36.0", "1.37.0"])
@pytest.mark.parametrize("driver", [D, OTHER_DRIVER_NAME])
def test_every_extended_resource_class_is_valid(kubernetes: str, driver: str) -> None:
    classes = device_classes(driver, EVERYTHING_EXTENDED)

    assert len(classes) == 3 + len(SHARING_CLASSES) + len(catalog_mig_profiles()) + 4
    for device_class in classes:
        kubernetes_validate.validate(device_class, kubernetes, strict=True)
        assert (
            extended_resource_name_problem(device_class["spec"].get("extendedResourceName", "a.b/c")) is None
        )


@pytest.mark.parametrize("driver", [D, OTHER_DRIVER_NAME, "accel.example.org"])
def test_classes_are_named_by_type_under_the_driver_name(driver: str) -> None:
    plain = device_classes(driver)
    extended = device_classes(driver, ExtendedResources(("1g.10gb", "1g.10gb+me"), (512 * 2**20, 10 * 2**30)))

    domain = {
        D: "dra-driver.dev",
        OTHER_DRIVER_NAME: "example.com",
        "accel.example.org": "accel.example.org",
    }[driver]
    assert [c["metadata"]["name"] for c in plain] == [
        f"gpu.{domain}",
        f"mig.{domain}",
        f"vgpu.{domain}",
        *(f"{prefix}.{domain}" for prefix in SHARING_CLASSES),
    ]
    assert all(dns_subdomain_problem(c["metadata"]["name"]) is None for c in plain)
    assert all(c["metadata"]["labels"] == {"app.kubernetes.io/name": "dra-driver"} for c in plain)
    assert all("extendedResourceName" not in c["spec"] for c in plain)
    assert [(c["metadata"]["name"], c["spec"].get("extendedResourceName")) for c in extended] == [
        (f"gpu.{domain}", "nvidia.com/gpu"),
        (f"mig.{domain}", None),
        (f"vgpu.{domain}", None),
        (f"gpu-time-sliced.{domain}", None),
        (f"gpu-mps.{domain}", None),
        (f"mig-1g.10gb.{domain}", "nvidia.com/mig-1g.10gb"),
        (f"mig-1g.10gb.me.{domain}", "nvidia.com/mig-1g.10gb.me"),
        (f"vgpu-512mi.{domain}", "nvidia.com/vgpu-512mi"),
        (f"vgpu-10gi.{domain}", "nvidia.com/vgpu-10gi"),
    ]
    assert all(dns_subdomain_problem(c["metadata"]["name"]) is None for c in extended)


def test_a_driver_name_that_could_break_out_of_the_cel_string_is_refused() -> None:
    with pytest.raises(ValueError, match="DNS subdomain"):
        device_classes('gpu" || true || "')


# --- What the class selectors select ----------------------------------------------------------


@pytest.mark.parametrize("driver", [D, OTHER_DRIVER_NAME])
@pytest.mark.parametrize("extended", [None, ExtendedResources(("1g.10gb",))])
def test_each_class_selects_exactly_the_drivers_devices_of_its_type(
    driver: str, extended: ExtendedResources | None
) -> None:
    for device_class in device_classes(driver, extended)[:3]:
        device_type = device_class["metadata"]["name"].split(".")[0]
        (only_selector,) = device_class["spec"]["selectors"]
        expression = only_selector["cel"]["expression"]

        selected = {
            (owner, device["name"]) for owner, device in every_device() if selects(expression, owner, device)
        }

        expected = {(driver, name) for name, of_type in TYPES.items() if of_type == device_type}
        assert selected == expected, device_class["metadata"]["name"]


def test_without_the_driver_check_a_foreign_device_would_abort_the_allocation() -> None:
    """Why the class selectors check the driver first: the bare type check is an error on a
    device without attributes in our domain, and an error aborts the whole claim."""
    with pytest.raises(CelEvaluationError, match="type"):
        selects(f'device.attributes["{D}"].type == "gpu"', "gpu.other-vendor.example", FOREIGN_GPU)


# --- Selectors as users write them --------------------------------------------------------------

PRODUCT = f'device.attributes["{D}"].productName == "NVIDIA H100 80GB HBM3"'
AT_LEAST_40GI = f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0'
NEWER_THAN_AMPERE = f'device.attributes["{D}"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))'
ROOT_COMPLEX = 'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"'
HAS_PROFILE = f'"profile" in device.attributes["{D}"]'


@pytest.mark.parametrize(
    ("expression", "driver", "device", "expected"),
    [
        (PRODUCT, D, WHOLE_GPU, True),
        (PRODUCT, D, MIG, False),
        (AT_LEAST_40GI, D, WHOLE_GPU, True),  # 81559Mi
        (AT_LEAST_40GI, D, SHARED_VGPU, True),  # 46068Mi
        (AT_LEAST_40GI, D, PARTITION_VGPU, False),  # 20096Mi
        (NEWER_THAN_AMPERE, D, WHOLE_GPU, True),  # 9.0.0
        (NEWER_THAN_AMPERE, D, MIG, False),  # 8.0.0 is not greater than itself
        (NEWER_THAN_AMPERE, D, PARTITION_VGPU, True),  # 8.6.0
        (ROOT_COMPLEX, D, WHOLE_GPU, True),
        (ROOT_COMPLEX, D, MIG, True),
        (ROOT_COMPLEX, D, SHARED_VGPU, False),
        (HAS_PROFILE, D, MIG, True),
        (HAS_PROFILE, D, WHOLE_GPU, False),
        # Kubernetes answers an absent domain with an empty map, so the guard holds on any device.
        (HAS_PROFILE, "gpu.other-vendor.example", FOREIGN_GPU, False),
        (HAS_PROFILE, OTHER_DRIVER_NAME, MIG, False),
        (f'"memory" in device.capacity["{D}"]', "gpu.other-vendor.example", FOREIGN_GPU, False),
        (f'{HAS_PROFILE} && device.attributes["{D}"].profile == "1g.5gb"', D, MIG, True),
        (f'{HAS_PROFILE} && device.attributes["{D}"].profile == "1g.5gb"', D, WHOLE_GPU, False),
        ("device.allowMultipleAllocations", D, SHARED_VGPU, True),
        ("device.allowMultipleAllocations", D, PARTITION_VGPU, False),
        (f'device.attributes["{D}"].productName.startsWith("NVIDIA")', D, PARTITION_VGPU, True),
        (f'cel.bind(gpu, device.attributes["{D}"], gpu.type == "gpu" && gpu.index == 0)', D, WHOLE_GPU, True),
        (f'device.attributes["{D}"][?"profile"].orValue("") == ""', D, WHOLE_GPU, True),
        (f'device.capacity["{D}"].cores.isLessThan(quantity("50"))', D, PARTITION_VGPU, True),
        (f'device.capacity["{D}"].memory == quantity("81559Mi")', D, WHOLE_GPU, True),
        (f'device.capacity["{D}"].multiprocessors.asInteger() > 100', D, WHOLE_GPU, True),
        (f'device.attributes["{D}"].driverVersion.major() >= 580', D, WHOLE_GPU, True),
        (f'device.attributes["{D}"].cudaComputeCapability == semver("9.0.0")', D, WHOLE_GPU, True),
        (f'device.attributes["{D}"].index == 0', D, WHOLE_GPU, True),
        (
            'device.attributes["gpu.other-vendor.example"].model.contains("MI300")',
            "gpu.other-vendor.example",
            FOREIGN_GPU,
            True,
        ),
    ],
)
def test_user_selectors_select_what_their_author_means(
    expression: str, driver: str, device: dict[str, Any], expected: bool
) -> None:
    assert selects(expression, driver, device) is expected


@pytest.mark.parametrize(
    ("expression", "device", "message"),
    [
        # A missing attribute is an error, not false: why `"profile" in ...` has to guard it.
        (f'device.attributes["{D}"].profile == "1g.5gb"', WHOLE_GPU, "profile"),
        ('device.attributes["other.example.com"].type == "gpu"', WHOLE_GPU, "type"),
        (f'device.attributes["{D}"].productName', WHOLE_GPU, "not a bool"),
        (
            f'device.attributes["{D}"].cudaComputeCapability.compareTo(quantity("1")) == 0',
            WHOLE_GPU,
            "overload",
        ),
        (f'device.capacity["{D}"].memory.compareTo(semver("1.0.0")) == 0', WHOLE_GPU, "overload"),
        ('quantity("200K") == quantity("200k")', WHOLE_GPU, "suffix"),
        ('quantity("9999999999999999999999999999999999999G").asInteger() > 0', WHOLE_GPU, "integer"),
        ('semver("v1.0.0") == semver("1.0.0")', WHOLE_GPU, "semantic version"),
    ],
)
def test_selectors_that_kubernetes_would_fail_on_raise(
    expression: str, device: dict[str, Any], message: str
) -> None:
    with pytest.raises(CelEvaluationError, match=message):
        selects(expression, D, device)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("device.attributes[", "Syntax error"),
        (f'device.attributes["{D}"].index + 1', "must evaluate to bool"),
        ('quantity("1").sign() == 1', "undeclared reference to 'sign'"),
        ('quantity("1").compareTo(semver("1.0.0")) == 0', "no matching overload"),
        ('quantity("1").mul(2) == quantity("2")', "undeclared reference to 'mul'"),
    ],
)
def test_selectors_that_the_api_server_would_refuse_do_not_compile(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=message):
        selects(expression, D, WHOLE_GPU)


# --- Kubernetes' quantity and semver libraries -------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")',
        'quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M")',
        '!(quantity("200M") == quantity("0.3G"))',
        'quantity("50M").isLessThan(quantity("50Mi")) && !quantity("100M").isLessThan(quantity("50M"))',
        'quantity("50Mi").isGreaterThan(quantity("50M")) && !quantity("50M").isGreaterThan(quantity("100M"))',
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("50Mi").compareTo(quantity("50M")) == 1',
        'quantity("50k").add(quantity("20")) == quantity("50.02k")',
        'quantity("50k").add(20) == quantity("50020")',
        'quantity("50k").sub(quantity("20")) == quantity("49.98k")',
        'quantity("50k").sub(20000) == quantity("30k")',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() == 20',
        'quantity("50k").asInteger() == 50000 && quantity("1Gi").asInteger() == 1073741824',
        'quantity("50").isInteger() && !quantity("1500m").isInteger()',
        '!quantity("9999999999999999999999999999999999999G").isInteger()',
        'sign(quantity("-1m")) == -1 && sign(quantity("0")) == 0 && sign(quantity("1Ki")) == 1',
        'isQuantity("1.3Gi") && isQuantity("10000k") && !isQuantity("200K") && !isQuantity("Mi")',
        'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3',
        'semver("1.2.3").compareTo(semver("1.2.3")) == 0',
        'semver("1.2.3").compareTo(semver("2.0.0")) == -1 && semver("1.2.3").compareTo(semver("0.1.2")) == 1',
        'semver("1.10.0").isGreaterThan(semver("1.9.0")) && semver("1.9.0").isLessThan(semver("1.10.0"))',
        'semver("1.2.3+build.7") == semver("1.2.3") && semver("1.2.3-rc.1") != semver("1.2.3")',
        'isSemver("1.2.3-rc.1+b") && !isSemver("v1.2.3") && !isSemver("1.2") && !isSemver("01.2.3")',
        '!isSemver("1.2.3-01")',
    ],
)
def test_the_kubernetes_cel_libraries_behave_as_documented(expression: str) -> None:
    assert selects(expression, D, WHOLE_GPU) is True


SEMVER_PRECEDENCE = [
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1",
    "1.1.0",
    "2.0.0",
]


@pytest.mark.parametrize("lower", range(len(SEMVER_PRECEDENCE)))
def test_semver_ordering_follows_the_semver_specification(lower: int) -> None:
    for higher in range(len(SEMVER_PRECEDENCE)):
        expression = (
            f'semver("{SEMVER_PRECEDENCE[lower]}").compareTo(semver("{SEMVER_PRECEDENCE[higher]}"))'
            f" == {(lower > higher) - (lower < higher)}"
        )
        assert selects(expression, D, WHOLE_GPU), expression


# --- The quantity parser ------------------------------------------------------------------------

BINARY_SUFFIXES = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
DECIMAL_SUFFIXES = [("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6), ("G", 9), ("T", 12)]
DECIMAL_SUFFIXES += [("P", 15), ("E", 18)]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.5Gi", 1610612736),
        ("100m", Fraction(1, 10)),
        ("1e3", 1000),
        ("81559Mi", 81559 * 2**20),
        ("0", 0),
        ("-1.5k", -1500),
        ("+2M", 2_000_000),
        ("1E", 10**18),
        ("1E3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("1e+3", 1000),
        ("1.", 1),
        (".5", Fraction(1, 2)),
        ("0.5Ki", 512),
        ("20E", 20 * 10**18),
        # Finer than nano is rounded away from zero, so that asking for a little never asks for nothing.
        ("0.1n", Fraction(1, 10**9)),
        ("-0.1n", -Fraction(1, 10**9)),
        ("1.0000000001", Fraction(1_000_000_001, 10**9)),
        # Binary-suffixed values are capped at the largest int64.
        ("16Ei", 2**63 - 1),
    ],
)
def test_known_quantities(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "1K", "Mi", "10Mo", "10Mm", "1.2.3", "abc", "1e", "--1", " 1", "1 ", "1e2000", "1_000", "."]
)
def test_malformed_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"quantit|suffix|exponent"):
        parse_quantity(text)


@given(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from(BINARY_SUFFIXES))
def test_an_integer_with_a_binary_suffix_parses_to_its_value(number: int, suffix: str) -> None:
    magnitude = min(abs(number) * 1024 ** (BINARY_SUFFIXES.index(suffix) + 1), 2**63 - 1)
    assert parse_quantity(f"{number}{suffix}") == (magnitude if number >= 0 else -magnitude)


@given(st.integers(min_value=-(10**30), max_value=10**30), st.sampled_from(DECIMAL_SUFFIXES))
def test_a_decimal_suffix_means_its_power_of_ten(number: int, suffix_and_exponent: tuple[str, int]) -> None:
    suffix, exponent = suffix_and_exponent
    value = number * Fraction(10) ** exponent
    assert parse_quantity(f"{number}{suffix}") == value
    assert parse_quantity(f"{number}e{exponent}") == value


@pytest.mark.parametrize("driver", [D, OTHER_DRIVER_NAME])
def test_the_sharing_classes_select_whole_gpus_and_carry_a_config_the_agent_decodes(driver: str) -> None:
    """gpu-time-sliced and gpu-mps: the whole-GPU selector, and a GpuConfig of this driver whose
    sharing is the class's (what prepare then applies, as the class's config comes first)."""
    classes = {item["metadata"]["name"]: item for item in device_classes(driver)}
    domain = driver.removeprefix("gpu.")
    whole = classes[f"gpu.{domain}"]["spec"]["selectors"]
    strategies = {}
    for prefix in SHARING_CLASSES:
        spec = classes[f"{prefix}.{domain}"]["spec"]
        assert spec["selectors"] == whole
        ((entry,),) = [spec["config"]]
        assert entry["opaque"]["driver"] == driver
        config = decode_parameters(entry["opaque"]["parameters"])
        assert isinstance(config, GpuConfig)
        strategies[prefix] = config.sharing.strategy
    assert strategies == {"gpu-time-sliced": "TimeSlicing", "gpu-mps": "MPS"}
