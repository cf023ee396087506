"""The daemon pod's manifest: valid for every supported API server, named only from a checked UID."""

from pathlib import Path

import kubernetes_validate
import pytest

from dra_driver.claims.sharing.mps_pod_spec import (
    InvalidDaemonPod,
    MpsPodSettings,
    claim_uid_of,
    daemon_pod,
    daemon_pod_name,
)
from dra_driver.claims.sharing.sharing import MpsDaemonSpec, MpsDirectories
from tests.support.k8s_schemas import KUBERNETES_VERSIONS

CLAIM = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
SETTINGS = MpsPodSettings(
    namespace="dra-driver",
    node_name="node-a",
    image="registry.example/dra-driver:1",
    driver_root=Path("/driver-root"),
    host_driver_root=Path("/run/nvidia/driver"),
    command=("/driver-root/usr/bin/nvidia-cuda-mps-control", "-f"),
    environment={"PATH": "/usr/bin"},
    privileged=True,
)
SPEC = MpsDaemonSpec(MpsDirectories(Path("/run/dra-driver/mps"), CLAIM), ("GPU-a", "GPU-b"))


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
def test_the_pod_is_valid_for_the_api_server(kubernetes: str) -> None:
    kubernetes_validate.validate(daemon_pod(SPEC, SETTINGS), kubernetes, strict=True)


def test_the_pod_mounts_the_driver_root_read_only_where_the_agent_sees_it_and_the_claims_directories() -> (
    None
):
    pod = daemon_pod(SPEC, SETTINGS)
    (container,) = pod["spec"]["containers"]
    volumes = {volume["name"]: volume["hostPath"]["path"] for volume in pod["spec"]["volumes"]}
    mounts = {
        mount["name"]: (mount["mountPath"], mount.get("readOnly", False))
        for mount in container["volumeMounts"]
    }
    assert volumes == {
        "driver-root": "/run/nvidia/driver",
        "mps": f"/run/dra-driver/mps/{CLAIM}",
        "shm": f"/run/dra-driver/mps/{CLAIM}/shm",
    }
    assert mounts == {
        "driver-root": ("/driver-root", True),
        "mps": (f"/run/dra-driver/mps/{CLAIM}", False),
        "shm": ("/dev/shm", False),
    }
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/dra-driver/mps/{CLAIM}/pipe"
    assert pod["metadata"]["name"] == f"mps-{CLAIM}" and pod["spec"]["nodeName"] == "node-a"
    assert claim_uid_of(pod) == CLAIM


@pytest.mark.parametrize("uid", ["../../etc", "0B7C4D6E-1F2A-4B3C-8D9E-0A1B2C3D4E5F", "", "x" * 300])
def test_a_pod_name_comes_only_from_a_well_formed_claim_uid(uid: str) -> None:
    with pytest.raises(InvalidDaemonPod, match=r"^MPS daemon pod of a claim: uid: "):
        daemon_pod_name(uid)


def test_pods_that_are_not_daemons_name_no_claim() -> None:
    pod = daemon_pod(SPEC, SETTINGS)
    assert claim_uid_of({"metadata": {"labels": {"resource.kubernetes.io/claim-uid": CLAIM}}}) is None
    pod["metadata"]["labels"]["resource.kubernetes.io/claim-uid"] = "../x"
    assert claim_uid_of(pod) is None
    assert claim_uid_of({}) is None
