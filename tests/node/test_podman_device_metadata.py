"""KEP-5304 device metadata read by a real container: podman runs a container with the CDI IDs
that prepare returned, and the container reads each request's metadata file at the standard
path, as a workload would, without any access to the API server.

podman resolves the metadata mounts through the upstream CDI library against the claim's spec,
so this proves the mount (a single file, read-only) and its container path are what runtimes do.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.tools import kubelet_client, podman
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support import podman_tier
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate_results
from tests.support.device_metadata_schema import metadata_stream, validate_metadata

# A driver name of the test's own, so its spec files cannot clash with anything else in /var/run/cdi.
DRIVER = "gpu.metadata-test.dra-driver.dev"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
SEPARATOR = "----"


@pytest.fixture
def podman_agent(short_dir: Path, kubeconfig: Path) -> Iterator[AgentProcess]:
    podman_tier.require_podman()
    dirs = AgentDirs(root=short_dir / "node", driver_name=DRIVER)
    agent = start_agent(dirs, kubeconfig, extra=("--cdi-dir", str(podman.CDI_DIRS[1])))
    yield agent
    agent.terminate()


async def read_in_container(
    agent: AgentProcess, claim: ClaimArg, paths: list[str]
) -> list[list[dict[str, Any]]]:
    """Prepares `claim`, runs a container with every CDI ID of the answer that cats each of `paths`
    (and tries to overwrite the first), unprepares; returns each file's objects in order."""
    socket = agent.dirs.dra_socket
    answer = (await kubelet_client.prepare(socket, "v1", [claim]))["claims"][claim.uid]
    assert answer["error"] == ""
    cdi_ids = [cdi_id for device in answer["devices"] for cdi_id in device["cdi_device_ids"]]
    script = "; ".join(f"cat {path}; echo {SEPARATOR}" for path in paths)
    script += f"; (echo changed > {paths[0]}) 2>/dev/null || echo read-only"
    try:
        seen = podman.run_with_cdi_devices(cdi_ids, script)
    finally:
        unprepared = await kubelet_client.unprepare(socket, "v1", [claim])
    assert unprepared["claims"][claim.uid]["error"] == ""
    *files, rest = seen.split(f"{SEPARATOR}\n")
    assert rest == "read-only\n", "the metadata file must be read-only in the container"
    return [metadata_stream(text.encode()) for text in files]


async def test_a_container_reads_the_metadata_of_its_claims_devices_at_the_standard_path(
    podman_agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    results = [
        {"request": "pair", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-2"},
        {"request": "pair", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-5"},
        {"request": "single", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-7"},
    ]
    uid = allocate_results(claims_api, "trainer", results)
    claim = ClaimArg("default", "trainer", uid)
    paths = [
        f"{CONTAINER_DIR}/resourceclaims/trainer/{request}/{DRIVER}-metadata.json"
        for request in ("pair", "single")
    ]

    pair, single = await read_in_container(podman_agent, claim, paths)

    gpus = simulated_gpus(NODE_NAME, resolve_node_spec("dgx-h100"))
    for stream, request, indices in ((pair, "pair", [2, 5]), (single, "single", [7])):
        assert [document["apiVersion"] for document in stream] == [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1",
        ]
        for document in stream:
            validate_metadata(document)
            assert document["metadata"] == {
                "name": "trainer",
                "namespace": "default",
                "uid": uid,
                "generation": 1,
            }
            ((listed,),) = [[r for r in document["requests"] if r["name"] == request]]
            assert [
                (d["driver"], d["pool"], d["name"], d["attributes"]["uuid"], d["attributes"]["productName"])
                for d in listed["devices"]
            ] == [
                (DRIVER, NODE_NAME, f"gpu-{i}", {"string": gpus[i].uuid}, {"string": "NVIDIA H100 80GB HBM3"})
                for i in indices
            ]
    files = podman_agent.dirs.state_dir / "dra-device-metadata"
    assert not list(files.glob(f"{uid}_*")), "unprepare removes the files"


async def test_a_template_claims_container_reads_its_metadata_under_the_pod_claim_name(
    podman_agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-1"}]
    uid = allocate_results(
        claims_api, "pod-1-gpus-7xq2d", results, annotations={"resource.kubernetes.io/pod-claim-name": "gpus"}
    )
    claim = ClaimArg("default", "pod-1-gpus-7xq2d", uid)

    ((document, _),) = await read_in_container(
        podman_agent, claim, [f"{CONTAINER_DIR}/resourceclaimtemplates/gpus/gpu/{DRIVER}-metadata.json"]
    )

    assert document["podClaimName"] == "gpus"
    assert document["metadata"]["name"] == "pod-1-gpus-7xq2d"
    assert [d["name"] for r in document["requests"] for d in r["devices"]] == ["gpu-1"]
    assert json.dumps(document).count(simulated_gpus(NODE_NAME, resolve_node_spec("dgx-h100"))[1].uuid) == 1
