"""NodePrepareResources / NodeUnprepareResources over the real DRA socket, for both API versions,
with claims served by the stand-in API server through the official client."""

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client, config

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg, DraApi
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate, claim_body
from tests.support.image import IMAGE_ENVIRONMENT
from tests.support.publishing import add_node
from tests.support.waiting import wait_until

KIND = "k8s.gpu.dra-driver.dev/claim"
APIS: list[DraApi] = ["v1", "v1beta1"]


async def prepare(agent: AgentProcess, api: DraApi, *claims: ClaimArg) -> dict[str, Any]:
    answer = await kubelet_client.prepare(agent.dirs.dra_socket, api, list(claims))
    claims_answer: dict[str, Any] = answer["claims"]
    return claims_answer


async def unprepare(agent: AgentProcess, api: DraApi, *claims: ClaimArg) -> dict[str, Any]:
    answer = await kubelet_client.unprepare(agent.dirs.dra_socket, api, list(claims))
    claims_answer: dict[str, Any] = answer["claims"]
    return claims_answer


@pytest.fixture(scope="module")
def shared_node() -> Iterator[tuple[ApiServer, AgentProcess]]:
    """One API server and one agent for every test here that takes `agent`: starting an agent is
    most of such a test's time. The tests that restart agents get a node of their own (`own_node`)."""
    server = ApiServer().start()
    add_node(server)
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    kubeconfig = server.write_kubeconfig(root / "kubeconfig")
    agent = start_agent(AgentDirs(root=root / "node"), kubeconfig, env=IMAGE_ENVIRONMENT)
    agent.wait_for_log("resourceslices published")
    yield server, agent
    agent.terminate()
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def apiserver(shared_node: tuple[ApiServer, AgentProcess]) -> ApiServer:
    return shared_node[0]


@pytest.fixture
async def agent(
    shared_node: tuple[ApiServer, AgentProcess], claims_api: client.ResourceV1Api
) -> AsyncIterator[AgentProcess]:
    """The shared agent, handed back as a fresh one would be: every claim it holds unprepared, no
    claim in the API server, no fault armed."""
    server, shared = shared_node
    yield shared
    assert shared.process.poll() is None, shared.log_path.read_text()
    server.faults.latency_seconds, server.faults.fail_next = 0.0, 0
    held = [
        ClaimArg(**json.loads(path.read_text())["claim"])
        for path in (shared.dirs.state_dir / "claims").glob("*.json")
    ]
    assert await unprepare(shared, "v1", *held) == {claim.uid: {"error": ""} for claim in held}
    for claim in claims_api.list_namespaced_resource_claim("default").items:
        claims_api.delete_namespaced_resource_claim(claim.metadata.name, "default")
    assert not shared.dirs.cdi_dir.exists() or not any(shared.dirs.cdi_dir.iterdir())


@pytest.fixture
def own_node(short_dir: Path) -> Iterator[tuple[AgentDirs, Path, client.ResourceV1Api]]:
    """A node of its own (directories, kubeconfig, claims client), for tests that start agents."""
    server = ApiServer().start()
    add_node(server)
    kubeconfig = server.write_kubeconfig(short_dir / "own-kubeconfig")
    api_client = config.new_client_from_config(str(kubeconfig))
    yield AgentDirs(root=short_dir / "own-node"), kubeconfig, client.ResourceV1Api(api_client)
    api_client.close()
    server.stop()


def files_under(root: Path) -> set[str]:
    return {
        str(path.relative_to(root)) for path in root.rglob("*") if path.is_file() and path.suffix != ".log"
    }


def cdi_spec(dirs: AgentDirs, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((dirs.cdi_dir / f"k8s.gpu.dra-driver.dev-claim_{uid}.json").read_text())
    return spec


@pytest.mark.parametrize("api", APIS)
async def test_prepare_returns_devices_writes_cdi_spec_and_record(
    agent: AgentProcess, claims_api: client.ResourceV1Api, api: DraApi
) -> None:
    uid = allocate(claims_api, "one", {"gpu": "gpu-3"}, pool="node-a")

    answer = await prepare(agent, api, ClaimArg("default", "one", uid))

    assert answer == {
        uid: {
            "devices": [
                {
                    "request_names": ["gpu"],
                    "pool_name": "node-a",
                    "device_name": "gpu-3",
                    "cdi_device_ids": [f"{KIND}={uid}-gpu-3", f"{KIND}={uid}-gpu.metadata"],
                }
            ],
            "error": "",
        }
    }
    spec = cdi_spec(agent.dirs, uid)
    # The minimum version: device names may start with a digit only since CDI 0.5.0.
    assert spec["cdiVersion"] == ("0.3.0" if uid[0].isalpha() else "0.5.0")
    assert spec["kind"] == KIND
    assert [device["name"] for device in spec["devices"]] == [f"{uid}-gpu-3", f"{uid}-gpu.metadata"]
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "DRA_DEVICE_GPU_3_PRODUCT_NAME=NVIDIA H100 80GB HBM3" in env
    record = json.loads((agent.dirs.state_dir / "claims" / f"{uid}.json").read_text())
    assert record["claim"] == {"namespace": "default", "name": "one", "uid": uid}


@pytest.mark.parametrize("api", APIS)
async def test_prepare_and_unprepare_are_idempotent(
    agent: AgentProcess, claims_api: client.ResourceV1Api, api: DraApi
) -> None:
    uid = allocate(claims_api, "twice", {"gpu": "gpu-1"}, pool="node-a")
    claim = ClaimArg("default", "twice", uid)

    first = await prepare(agent, api, claim)
    assert await prepare(agent, api, claim) == first
    assert first[uid]["error"] == ""

    assert await unprepare(agent, api, claim) == {uid: {"error": ""}}
    assert await unprepare(agent, api, claim) == {uid: {"error": ""}}
    assert not (agent.dirs.cdi_dir / f"k8s.gpu.dra-driver.dev-claim_{uid}.json").exists()
    assert not (agent.dirs.state_dir / "claims" / f"{uid}.json").exists()


@pytest.mark.parametrize("api", APIS)
async def test_unprepare_of_an_unknown_claim_succeeds(agent: AgentProcess, api: DraApi) -> None:
    uid = "0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b"
    assert await unprepare(agent, api, ClaimArg("default", "never-prepared", uid)) == {uid: {"error": ""}}


async def test_unprepare_of_an_unknown_claim_removes_a_spec_left_without_record(agent: AgentProcess) -> None:
    uid = "0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b"
    agent.dirs.cdi_dir.mkdir(parents=True, exist_ok=True)
    orphan = agent.dirs.cdi_dir / f"k8s.gpu.dra-driver.dev-claim_{uid}.json"
    orphan.write_text("{}")  # what a crash between spec and record leaves behind

    assert await unprepare(agent, "v1", ClaimArg("default", "crashed", uid)) == {uid: {"error": ""}}
    assert not orphan.exists()


async def test_every_claim_of_a_call_gets_exactly_one_answer(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    good = allocate(claims_api, "good", {"a": "gpu-0", "b": "gpu-1"}, pool="node-a")
    missing = "11111111-2222-4333-8444-555555555555"

    answer = await prepare(
        agent, "v1", ClaimArg("default", "good", good), ClaimArg("default", "gone", missing)
    )

    assert set(answer) == {good, missing}
    assert answer[good]["error"] == ""
    assert sorted((d["request_names"], d["device_name"]) for d in answer[good]["devices"]) == [
        (["a"], "gpu-0"),
        (["b"], "gpu-1"),
    ]
    assert answer[missing] == {
        "devices": [],
        "error": "GET resourceclaims default/gone: not found (deleted, or never created)",
    }
    # Both devices of one claim, and the metadata mount of each request, share one spec file.
    assert [d["name"] for d in cdi_spec(agent.dirs, good)["devices"]] == [
        f"{good}-gpu-0",
        f"{good}-gpu-1",
        f"{good}-a.metadata",
        f"{good}-b.metadata",
    ]


async def test_an_empty_call_gets_an_empty_answer(agent: AgentProcess) -> None:
    assert await prepare(agent, "v1") == {}
    assert await unprepare(agent, "v1beta1") == {}


async def test_a_device_prepared_for_one_claim_is_refused_to_another(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    first = allocate(claims_api, "first", {"gpu": "gpu-2"}, pool="node-a")
    second = allocate(claims_api, "second", {"gpu": "gpu-2"}, pool="node-a")
    await prepare(agent, "v1", ClaimArg("default", "first", first))

    refused = (await prepare(agent, "v1", ClaimArg("default", "second", second)))[second]

    assert refused["devices"] == []
    assert refused["error"] == (
        f"claim default/second ({second}): device gpu-2 is already prepared for claim "
        f"default/first ({first}); it is exclusive and can serve one claim at a time"
    )
    assert not (agent.dirs.cdi_dir / f"k8s.gpu.dra-driver.dev-claim_{second}.json").exists()
    await unprepare(agent, "v1", ClaimArg("default", "first", first))
    assert (await prepare(agent, "v1", ClaimArg("default", "second", second)))[second]["error"] == ""


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "expected"),
    [
        ("default", "x", "../../../etc/passwd", "uid: '../../../etc/passwd' is not a Kubernetes UID"),
        ("default", "x", "3F9C1E52-7A4B-4D2E-9B61-0C8D5E2F4A17", "is not a Kubernetes UID"),
        ("default", "x", "", "uid: '' is not a Kubernetes UID"),
        (
            "../kube-system",
            "x",
            "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17",
            "namespace: '../kube-system' is not a DNS label",
        ),
        ("default", "a/b", "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17", "name: 'a/b' is not a DNS subdomain"),
        ("default", "n" * 300, "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17", "is longer than 253 characters"),
    ],
)
@pytest.mark.parametrize("call", ["prepare", "unprepare"])
async def test_bad_claim_identities_are_refused_before_any_file_is_touched(
    agent: AgentProcess, namespace: str, name: str, uid: str, expected: str, call: str
) -> None:
    before = files_under(agent.dirs.root)

    answer = await (prepare if call == "prepare" else unprepare)(agent, "v1", ClaimArg(namespace, name, uid))

    assert set(answer) == {uid}
    assert answer[uid]["error"].startswith("invalid claim identity: ")
    assert expected in answer[uid]["error"]
    assert files_under(agent.dirs.root) == before


async def test_a_replaced_claim_is_refused(agent: AgentProcess, claims_api: client.ResourceV1Api) -> None:
    allocate(claims_api, "replaced", {"gpu": "gpu-0"}, pool="node-a")
    kubelet_knows = "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17"

    error = (await prepare(agent, "v1", ClaimArg("default", "replaced", kubelet_knows)))[kubelet_knows][
        "error"
    ]

    assert "now has UID" in error
    assert f"kubelet asked for {kubelet_knows}: the claim was deleted and re-created" in error


async def test_an_unallocated_claim_is_refused(agent: AgentProcess, claims_api: client.ResourceV1Api) -> None:
    created = claims_api.create_namespaced_resource_claim("default", claim_body("pending", ["gpu"]))
    uid = created.metadata.uid

    error = (await prepare(agent, "v1", ClaimArg("default", "pending", uid)))[uid]["error"]

    assert error == f"claim default/pending ({uid}) is not allocated (status.allocation is missing)"


async def test_results_of_other_drivers_are_left_alone(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "nic", {"nic": "eth-0"}, pool="node-a", driver="net.example.com")

    assert await prepare(agent, "v1", ClaimArg("default", "nic", uid)) == {uid: {"devices": [], "error": ""}}
    assert not agent.dirs.cdi_dir.exists() or not any(agent.dirs.cdi_dir.iterdir())


@pytest.mark.parametrize(
    ("pool", "device", "expected"),
    [
        (
            "node-b",
            "gpu-0",
            "device gpu-0 was allocated from pool 'node-b', but this node serves pool 'node-a'",
        ),
        ("node-a", "gpu-99", "device 'gpu-99' does not exist on this node"),
    ],
)
async def test_devices_this_node_does_not_have_are_refused(
    agent: AgentProcess, claims_api: client.ResourceV1Api, pool: str, device: str, expected: str
) -> None:
    uid = allocate(claims_api, "elsewhere", {"gpu": device}, pool=pool)

    assert expected in (await prepare(agent, "v1", ClaimArg("default", "elsewhere", uid)))[uid]["error"]


async def test_request_names_are_the_main_request_of_a_first_available_choice(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    body = claim_body("fallback", [])
    body["spec"]["devices"]["requests"] = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.dra-driver.dev"},
                {"name": "small", "deviceClassName": "gpu.dra-driver.dev"},
            ],
        }
    ]
    created = claims_api.create_namespaced_resource_claim("default", body)
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu/small",
                        "driver": "gpu.dra-driver.dev",
                        "pool": "node-a",
                        "device": "gpu-5",
                    }
                ]
            }
        }
    }
    claims_api.replace_namespaced_resource_claim_status(
        "fallback",
        "default",
        {"metadata": {"name": "fallback", "namespace": "default"}, "spec": body["spec"], "status": status},
    )

    answer = await prepare(agent, "v1", ClaimArg("default", "fallback", created.metadata.uid))

    assert answer[created.metadata.uid]["devices"][0]["request_names"] == ["gpu"]


async def test_unprepare_after_restart_works_from_local_state_alone(
    own_node: tuple[AgentDirs, Path, client.ResourceV1Api],
) -> None:
    agent_dirs, kubeconfig, claims_api = own_node
    uid = allocate(claims_api, "survivor", {"gpu": "gpu-4"}, pool="node-a")
    claim = ClaimArg("default", "survivor", uid)
    first = start_agent(agent_dirs, kubeconfig)
    answer = await prepare(first, "v1", claim)
    assert first.terminate() == 0

    second = start_agent(agent_dirs, kubeconfig)
    try:
        assert second.wait_for_log("claims restored from state")["prepared_claims"] == 1
        assert await prepare(second, "v1", claim) == answer  # the recorded answer, not a second preparation
        claims_api.delete_namespaced_resource_claim("survivor", "default")  # gone from the API server

        assert await unprepare(second, "v1beta1", claim) == {uid: {"error": ""}}
        assert not (agent_dirs.cdi_dir / f"k8s.gpu.dra-driver.dev-claim_{uid}.json").exists()
        assert not (agent_dirs.state_dir / "claims" / f"{uid}.json").exists()
    finally:
        second.terminate()


def test_specs_no_record_owns_are_removed_at_start(
    own_node: tuple[AgentDirs, Path, client.ResourceV1Api],
) -> None:
    agent_dirs, kubeconfig, _ = own_node
    agent_dirs.cdi_dir.mkdir(parents=True)
    orphan = agent_dirs.cdi_dir / "k8s.gpu.dra-driver.dev-claim_0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b.json"
    foreign = agent_dirs.cdi_dir / "k8s.net.example.com-claim_0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b.json"
    for path in (orphan, foreign):
        path.write_text("{}")

    agent = start_agent(agent_dirs, kubeconfig)
    try:
        assert not orphan.exists()
        assert foreign.exists()  # another driver's spec is not ours to remove
        assert agent.wait_for_log("removing CDI spec no prepared claim owns")["path"] == str(orphan)
    finally:
        agent.terminate()


async def test_device_ownership_survives_a_restart(
    own_node: tuple[AgentDirs, Path, client.ResourceV1Api],
) -> None:
    agent_dirs, kubeconfig, claims_api = own_node
    first_uid = allocate(claims_api, "holder", {"gpu": "gpu-6"}, pool="node-a")
    second_uid = allocate(claims_api, "latecomer", {"gpu": "gpu-6"}, pool="node-a")
    first = start_agent(agent_dirs, kubeconfig)
    await prepare(first, "v1", ClaimArg("default", "holder", first_uid))
    first.terminate()

    second = start_agent(agent_dirs, kubeconfig)
    try:
        error = (await prepare(second, "v1", ClaimArg("default", "latecomer", second_uid)))[second_uid][
            "error"
        ]
        assert "device gpu-6 is already prepared for claim default/holder" in error
    finally:
        second.terminate()


async def test_a_call_kubelet_abandons_still_completes_consistently(
    agent: AgentProcess, apiserver: Any, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "abandoned", {"gpu": "gpu-2"}, pool="node-a")
    apiserver.faults.latency_seconds = 0.5

    async def call_with_short_deadline() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(f"unix://{agent.dirs.dra_socket}") as channel:
            request = v1_pb2.NodePrepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace="default", name="abandoned", uid=uid)]
            )
            try:
                await v1_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=0.1)
            except grpc.aio.AioRpcError as error:
                return error.code()
        return grpc.StatusCode.OK

    assert await call_with_short_deadline() == grpc.StatusCode.DEADLINE_EXCEEDED
    record = agent.dirs.state_dir / "claims" / f"{uid}.json"
    # The record exists from the reservation on; the spec is written before it says prepared.
    wait_until(lambda: record.exists() and json.loads(record.read_text())["state"] == "prepared")
    assert (agent.dirs.cdi_dir / f"k8s.gpu.dra-driver.dev-claim_{uid}.json").exists()
    apiserver.faults.latency_seconds = 0
    answer = await prepare(agent, "v1", ClaimArg("default", "abandoned", uid))
    assert answer[uid]["devices"][0]["device_name"] == "gpu-2"


async def test_api_server_errors_become_per_claim_errors(
    agent: AgentProcess, apiserver: Any, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "flaky", {"gpu": "gpu-0"}, pool="node-a")
    apiserver.faults.fail_next, apiserver.faults.fail_status = 1, 503

    error = (await prepare(agent, "v1", ClaimArg("default", "flaky", uid)))[uid]["error"]

    assert error == "GET resourceclaims default/flaky: API server answered 503: injected fault"
    assert (await prepare(agent, "v1", ClaimArg("default", "flaky", uid)))[uid][
        "error"
    ] == ""  # kubelet's retry works
