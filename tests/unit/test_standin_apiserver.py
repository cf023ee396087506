"""The stand-in API server is strict where the real one is; these checks keep it honest."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.support.apiserver import ApiServer
from tests.support.claims import allocate, claim_body


def raw(server: ApiServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    started = ApiServer().start()
    yield started
    started.stop()


def test_unknown_fields_are_refused_with_a_status(server: ApiServer) -> None:
    body = claim_body("c", ["gpu"])
    body["spec"]["devices"]["requests"][0]["exactly"]["colour"] = "green"

    code, status = raw(server, "POST", CLAIMS, body)

    assert code == 422
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert "colour" in status["message"]


def test_objects_get_uid_and_resource_version_and_names_are_checked(server: ApiServer) -> None:
    code, created = raw(server, "POST", CLAIMS, claim_body("c", ["gpu"]))
    assert code == 201
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]

    assert raw(server, "POST", CLAIMS, claim_body("c", ["gpu"]))[1]["reason"] == "AlreadyExists"
    assert raw(server, "POST", CLAIMS, claim_body("Bad_Name", ["gpu"]))[0] == 422
    code, missing = raw(server, "GET", CLAIMS + "/absent")
    assert (code, missing["reason"], missing["details"]["name"]) == (404, "NotFound", "absent")
    assert raw(server, "GET", "/apis/resource.k8s.io/v1/nonsense")[0] == 404


def test_stale_writes_conflict_and_claim_specs_are_immutable(server: ApiServer) -> None:
    _, created = raw(server, "POST", CLAIMS, claim_body("c", ["gpu"]))
    stale = json.loads(json.dumps(created))
    status = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "d.example.com", "pool": "p", "device": "gpu-0"}]
            }
        }
    }
    code, updated = raw(server, "PUT", CLAIMS + "/c/status", {**created, "status": status})
    assert code == 200
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]

    assert raw(server, "PUT", CLAIMS + "/c/status", {**stale, "status": {}})[1]["reason"] == "Conflict"
    changed = {**updated, "spec": claim_body("c", ["other"])["spec"]}
    assert raw(server, "PUT", CLAIMS + "/c", changed)[0] == 422


def test_the_status_subresource_is_the_only_way_to_write_status(server: ApiServer) -> None:
    body = claim_body("c", ["gpu"])
    body["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    _, created = raw(server, "POST", CLAIMS, body)
    assert "status" not in created


def test_the_official_client_works_against_it(server: ApiServer, tmp_path: Path) -> None:
    api_client = config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    api = client.ResourceV1Api(api_client)
    uid = allocate(api, "c", {"gpu": "gpu-1"}, pool="node-a")

    claim = api.read_namespaced_resource_claim("c", "default")
    assert claim.metadata.uid == uid
    assert claim.status.allocation.devices.results[0].device == "gpu-1"
    assert server.request_count("GET", "resourceclaims") == 2
    nodes = client.CoreV1Api(api_client)
    nodes.create_node({"metadata": {"name": "node-a"}})
    assert nodes.read_node("node-a").metadata.uid
    api_client.close()


def test_faults_can_be_injected(server: ApiServer) -> None:
    server.faults.fail_next, server.faults.fail_status = 2, 503
    assert raw(server, "GET", CLAIMS)[0] == 503
    assert raw(server, "GET", CLAIMS)[0] == 503
    assert raw(server, "GET", CLAIMS)[0] == 200
