"""The kubelet wire contracts: generated code is fresh, and paths and field numbers match kubelet's."""

import filecmp
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor

from dra_driver._proto.dra.v1 import api_pb2 as dra_v1
from dra_driver._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dra_driver._proto.dra_health.v1 import api_pb2 as health_v1
from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from dra_driver._proto.pluginregistration.v1 import api_pb2 as registration
from dra_driver._proto.podresources.v1 import api_pb2 as podresources

REPO = Path(__file__).resolve().parents[3]
GENERATED = REPO / "dra_driver" / "_proto"


def test_generated_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "hack" / "gen-protos.sh"), str(tmp_path)],
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    fresh = tmp_path / "dra_driver" / "_proto"
    committed_files = sorted(
        p.relative_to(GENERATED) for p in GENERATED.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    assert committed_files == fresh_files, "run hack/gen-protos.sh and commit the result"
    stale = [str(p) for p in fresh_files if not filecmp.cmp(fresh / p, GENERATED / p, shallow=False)]
    assert stale == [], f"stale generated modules {stale}: run hack/gen-protos.sh and commit the result"


@pytest.mark.parametrize(
    ("module", "service", "full_name", "methods"),
    [
        (
            registration,
            "Registration",
            "pluginregistration.Registration",
            {
                "GetInfo": ("InfoRequest", "PluginInfo"),
                "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
            },
        ),
        (
            dra_v1,
            "DRAPlugin",
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            {
                "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
                "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse"),
            },
        ),
        (
            dra_v1beta1,
            "DRAPlugin",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            {
                "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
                "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse"),
            },
        ),
        (
            health_v1alpha1,
            "DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
            {"NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse")},
        ),
        (
            health_v1,
            "DRAResourceHealth",
            "v1.DRAResourceHealth",
            {"NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse")},
        ),
        (
            podresources,
            "PodResourcesLister",
            "v1.PodResourcesLister",
            {
                "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
                "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
                "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
            },
        ),
    ],
)
def test_services_have_kubelets_grpc_paths(
    module: ModuleType, service: str, full_name: str, methods: dict[str, tuple[str, str]]
) -> None:
    descriptor = module.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == full_name
    assert {m.name: (m.input_type.name, m.output_type.name) for m in descriptor.methods} == methods
    streaming = {m.name: m.server_streaming for m in descriptor.methods}
    assert streaming == dict.fromkeys(methods, service == "DRAResourceHealth")


T = FieldDescriptor
REPEATED = "repeated"


def _fields(module: ModuleType, message: str) -> dict[str, tuple[int, int, bool]]:
    descriptor = module.DESCRIPTOR.message_types_by_name[message]
    return {f.name: (f.number, f.type, f.is_repeated) for f in descriptor.fields}


def test_registration_messages() -> None:
    assert _fields(registration, "PluginInfo") == {
        "type": (1, T.TYPE_STRING, False),
        "name": (2, T.TYPE_STRING, False),
        "endpoint": (3, T.TYPE_STRING, False),
        "supported_versions": (4, T.TYPE_STRING, True),
    }
    assert _fields(registration, "RegistrationStatus") == {
        "plugin_registered": (1, T.TYPE_BOOL, False),
        "error": (2, T.TYPE_STRING, False),
    }
    assert _fields(registration, "InfoRequest") == {}
    assert _fields(registration, "RegistrationStatusResponse") == {}


@pytest.mark.parametrize("module", [dra_v1, dra_v1beta1])
def test_dra_plugin_messages(module: ModuleType) -> None:
    device = {
        "request_names": (1, T.TYPE_STRING, True),
        "pool_name": (2, T.TYPE_STRING, False),
        "device_name": (3, T.TYPE_STRING, False),
        "cdi_device_ids": (4, T.TYPE_STRING, True),
    }
    if module is dra_v1:
        device["share_id"] = (5, T.TYPE_STRING, False)
        share_id = module.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"]
        assert share_id.has_presence  # `optional` on the wire: kubelet tells unset from empty
    assert _fields(module, "Device") == device
    assert _fields(module, "Claim") == {
        "namespace": (1, T.TYPE_STRING, False),
        "uid": (2, T.TYPE_STRING, False),
        "name": (3, T.TYPE_STRING, False),
    }
    assert _fields(module, "NodePrepareResourceResponse") == {
        "devices": (1, T.TYPE_MESSAGE, True),
        "error": (2, T.TYPE_STRING, False),
    }
    assert _fields(module, "NodeUnprepareResourceResponse") == {"error": (1, T.TYPE_STRING, False)}
    for request in ("NodePrepareResourcesRequest", "NodeUnprepareResourcesRequest"):
        assert _fields(module, request) == {"claims": (1, T.TYPE_MESSAGE, True)}
    for response in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
        claims = module.DESCRIPTOR.message_types_by_name[response].fields_by_name["claims"]
        assert claims.number == 1
        assert claims.message_type.GetOptions().map_entry  # map<string, ...> keyed by claim UID
        assert claims.message_type.fields_by_name["key"].type == T.TYPE_STRING


@pytest.mark.parametrize("module", [health_v1alpha1, health_v1])
def test_health_messages(module: ModuleType) -> None:
    assert _fields(module, "DeviceIdentifier") == {
        "pool_name": (1, T.TYPE_STRING, False),
        "device_name": (2, T.TYPE_STRING, False),
    }
    assert _fields(module, "DeviceHealth") == {
        "device": (1, T.TYPE_MESSAGE, False),
        "health": (2, T.TYPE_ENUM, False),
        "last_updated_time": (3, T.TYPE_INT64, False),
        "health_check_timeout_seconds": (4, T.TYPE_INT64, False),
        "message": (5, T.TYPE_STRING, False),
    }
    assert _fields(module, "NodeWatchResourcesResponse") == {"devices": (1, T.TYPE_MESSAGE, True)}
    status = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_pod_resources_messages() -> None:
    """kubelet's podresources/v1 wire facts: the path from a pod to the DRA devices its containers use."""
    assert _fields(podresources, "ListPodResourcesResponse") == {"pod_resources": (1, T.TYPE_MESSAGE, True)}
    assert _fields(podresources, "PodResources") == {
        "name": (1, T.TYPE_STRING, False),
        "namespace": (2, T.TYPE_STRING, False),
        "containers": (3, T.TYPE_MESSAGE, True),
        "cpu_ids": (4, T.TYPE_INT64, True),
        "memory": (5, T.TYPE_MESSAGE, True),
    }
    assert _fields(podresources, "ContainerResources") == {
        "name": (1, T.TYPE_STRING, False),
        "devices": (2, T.TYPE_MESSAGE, True),
        "cpu_ids": (3, T.TYPE_INT64, True),
        "memory": (4, T.TYPE_MESSAGE, True),
        "dynamic_resources": (5, T.TYPE_MESSAGE, True),
    }
    assert _fields(podresources, "DynamicResource") == {
        "claim_name": (2, T.TYPE_STRING, False),
        "claim_namespace": (3, T.TYPE_STRING, False),
        "claim_resources": (4, T.TYPE_MESSAGE, True),
    }
    assert _fields(podresources, "ClaimResource") == {
        "cdi_devices": (1, T.TYPE_MESSAGE, True),
        "driver_name": (2, T.TYPE_STRING, False),
        "pool_name": (3, T.TYPE_STRING, False),
        "device_name": (4, T.TYPE_STRING, False),
        "share_id": (5, T.TYPE_STRING, False),
    }
    claim_resource = podresources.DESCRIPTOR.message_types_by_name["ClaimResource"]
    assert claim_resource.fields_by_name["share_id"].has_presence
    assert _fields(podresources, "CDIDevice") == {"name": (1, T.TYPE_STRING, False)}
    assert _fields(podresources, "GetPodResourcesRequest") == {
        "pod_name": (1, T.TYPE_STRING, False),
        "pod_namespace": (2, T.TYPE_STRING, False),
    }
    assert _fields(podresources, "GetPodResourcesResponse") == {"pod_resources": (1, T.TYPE_MESSAGE, False)}
