"""The stand-in API server is strict where the real one is; these checks keep it honest."""

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
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


def raw_with_warnings(
    server: ApiServer, method: str, path: str, body: Any
) -> tuple[int, dict[str, Any], list[str]]:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), response.headers.get_all("Warning") or []
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers.get_all("Warning") or []


@pytest.mark.parametrize(
    ("query", "answer"),
    [
        # What the real server does (tests/e2e/test_stand_in_api_server.py compares the two).
        ("", (201, "", ['299 - "unknown field \\"spec.devices.requests[0].exactly.colour\\""'])),
        (
            "?fieldValidation=Warn",
            (201, "", ['299 - "unknown field \\"spec.devices.requests[0].exactly.colour\\""']),
        ),
        ("?fieldValidation=Ignore", (201, "", [])),
        ("?fieldValidation=Strict", (400, "BadRequest", [])),
    ],
)
def test_unknown_fields_follow_the_requests_field_validation(
    server: ApiServer, query: str, answer: tuple[int, str, list[str]]
) -> None:
    body = claim_body(f"c{len(query)}", ["gpu"])
    body["spec"]["devices"]["requests"][0]["exactly"]["colour"] = "green"

    code, returned, warnings = raw_with_warnings(server, "POST", CLAIMS + query, body)

    assert (code, returned.get("reason", ""), warnings) == answer
    if code == 201:
        assert "colour" not in returned["spec"]["devices"]["requests"][0]["exactly"]
    else:
        assert 'unknown field "spec.devices.requests[0].exactly.colour"' in returned["message"]
    assert raw_with_warnings(server, "POST", CLAIMS + "?fieldValidation=Loose", body)[0] == 400


def test_an_invalid_answer_names_the_field_in_its_causes(server: ApiServer) -> None:
    code, status = raw(server, "POST", CLAIMS, claim_body("c", ["GPU_0"]))

    assert (code, status["reason"]) == (422, "Invalid")
    assert [cause["field"] for cause in status["details"]["causes"]] == ["spec.devices.requests[0].name"]


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


# -- ResourceSlices, Events, and what the real server does to them ----------------------------------

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
EVENTS = "/api/v1/namespaces/default/events"
DRIVER = "gpu.dra-driver.dev"
NAME_SUFFIX = re.compile(r"[bcdfghjklmnpqrstvwxz2456789]{5}")
RFC3339_SECONDS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
OTHER_UID = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"


def slice_body(node: str = "node-a", driver: str = DRIVER, **spec: Any) -> dict[str, Any]:
    """A minimal valid ResourceSlice with a generated name; `spec` entries replace those of its
    spec, and None removes one."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"00000-{driver}-{node}-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"productName": {"string": "H100"}}}],
        },
    }
    merged = {**body["spec"], **spec}
    body["spec"] = {key: value for key, value in merged.items() if value is not None}
    return body


def event_body(reason: str = "Started", involved_namespace: str | None = None) -> dict[str, Any]:
    involved = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u"}
    if involved_namespace is not None:
        involved["namespace"] = involved_namespace
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "node-a."},
        "involvedObject": involved,
        "reason": reason,
        "message": "m",
        "type": "Normal",
        "source": {"component": "dra-driver"},
    }


def missing(sent: Any, stored: Any, path: str) -> set[str]:
    """The paths of what `sent` has and `stored` lacks (only the root of a dropped subtree)."""
    found: set[str] = set()
    if isinstance(sent, dict) and isinstance(stored, dict):
        for key, value in sent.items():
            inner = f"{path}.{key}"
            found |= {inner} if key not in stored else missing(value, stored[key], inner)
    elif isinstance(sent, list) and isinstance(stored, list):
        for index, (item, kept) in enumerate(zip(sent, stored, strict=True)):
            found |= missing(item, kept, f"{path}[{index}]")
    return found


def names(listed: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listed["items"]]


@pytest.fixture
def make_server() -> Iterator[Callable[..., ApiServer]]:
    """Servers of other versions or gates than the default one; stopped after the test."""
    started: list[ApiServer] = []

    def make(**options: Any) -> ApiServer:
        started.append(ApiServer(**options).start())
        return started[-1]

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def resource_api(server: ApiServer, tmp_path: Path) -> Iterator[client.ResourceV1Api]:
    api_client = config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield client.ResourceV1Api(api_client)
    api_client.close()


def test_generate_name_appends_five_characters_as_the_real_server_does(
    server: ApiServer, resource_api: client.ResourceV1Api
) -> None:
    prefix = f"00000-{DRIVER}-node-a-"
    first = resource_api.create_resource_slice(slice_body()).metadata.name
    second = resource_api.create_resource_slice(slice_body()).metadata.name

    assert first != second
    for name in (first, second):
        assert name.startswith(prefix) and NAME_SUFFIX.fullmatch(name.removeprefix(prefix))
    long = slice_body()
    long["metadata"]["generateName"] = "a" * 70
    name = raw(server, "POST", SLICES, long)[1]["metadata"]["name"]
    assert name[:58] == "a" * 58 and NAME_SUFFIX.fullmatch(name[58:])


def test_a_name_is_required_and_generated_ones_are_checked(server: ApiServer) -> None:
    nameless = slice_body()
    del nameless["metadata"]["generateName"]
    code, status = raw(server, "POST", SLICES, nameless)
    assert (code, status["reason"]) == (422, "Invalid")
    assert "name or generateName is required" in status["message"]

    upper = slice_body()
    upper["metadata"]["generateName"] = "Node-"
    code, status = raw(server, "POST", SLICES, upper)
    assert code == 422 and "metadata.generateName" in status["message"]


def test_field_selectors_filter_lists_by_the_fields_the_real_server_offers(
    server: ApiServer, resource_api: client.ResourceV1Api
) -> None:
    for node, driver in (("node-a", DRIVER), ("node-b", DRIVER), ("node-a", "other.example.com")):
        resource_api.create_resource_slice(slice_body(node, driver))
    resource_api.create_resource_slice(slice_body("cluster", nodeName=None, allNodes=True))

    def listed(selector: str) -> list[tuple[str, str]]:
        items = resource_api.list_resource_slice(field_selector=selector).items
        return sorted((item.spec.driver, item.spec.node_name or "") for item in items)

    assert listed(f"spec.driver={DRIVER},spec.nodeName=node-a") == [(DRIVER, "node-a")]
    assert listed("spec.nodeName==node-b") == [(DRIVER, "node-b")]
    assert listed(f"spec.driver!={DRIVER}") == [("other.example.com", "node-a")]
    assert listed("spec.nodeName=") == [(DRIVER, "")]  # a missing field reads as ""
    name = resource_api.list_resource_slice().items[0].metadata.name
    assert [
        item.metadata.name
        for item in resource_api.list_resource_slice(field_selector=f"metadata.name={name}").items
    ] == [name]


def test_unsupported_selectors_are_refused_as_the_real_server_refuses_them(server: ApiServer) -> None:
    code, status = raw(server, "GET", SLICES + "?fieldSelector=spec.pool.name%3Dnode-a")
    assert (code, status["reason"], status["message"]) == (
        400,
        "BadRequest",
        "field label not supported: spec.pool.name",
    )
    # Cluster-scoped objects have no namespace to select on; namespaced ones do.
    assert raw(server, "GET", SLICES + "?fieldSelector=metadata.namespace%3Ddefault")[0] == 400
    assert raw(server, "GET", CLAIMS + "?fieldSelector=metadata.namespace%3Ddefault")[0] == 200
    assert raw(server, "GET", SLICES + "?fieldSelector=spec.driver")[1]["message"].startswith(
        "invalid selector"
    )
    # Equality-based label selectors are served; set-based and existence ones are not.
    assert raw(server, "GET", SLICES + "?labelSelector=app%3Dx")[0] == 200
    for selector in ("app%20in%20(x)", "app", "!app", "app%3D%3Dx,bad%20key%3Dy"):
        code, status = raw(server, "GET", f"{SLICES}?labelSelector={selector}")
        assert code == 400 and "labelSelector" in status["message"], selector


def test_namespaced_lists_select_by_namespace_and_span_all_namespaces(server: ApiServer) -> None:
    raw(server, "POST", CLAIMS, claim_body("a", ["gpu"]))
    raw(server, "POST", CLAIMS.replace("default", "other"), claim_body("b", ["gpu"], namespace="other"))

    assert names(raw(server, "GET", CLAIMS)[1]) == ["a"]
    assert names(raw(server, "GET", "/apis/resource.k8s.io/v1/resourceclaims")[1]) == ["a", "b"]
    selected = raw(
        server, "GET", "/apis/resource.k8s.io/v1/resourceclaims?fieldSelector=metadata.namespace%3Dother"
    )
    assert names(selected[1]) == ["b"]


def test_delete_preconditions_conflict_with_the_real_message(
    server: ApiServer, resource_api: client.ResourceV1Api
) -> None:
    created = resource_api.create_resource_slice(slice_body())
    name, uid, version = created.metadata.name, created.metadata.uid, created.metadata.resource_version

    def delete(**preconditions: str) -> Any:
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(**preconditions))
        return resource_api.delete_resource_slice(name, body=options)

    with pytest.raises(client.ApiException) as wrong_uid:
        delete(uid=OTHER_UID, resource_version=version)
    assert wrong_uid.value.status == 409
    status = json.loads(wrong_uid.value.body)
    assert status["reason"] == "Conflict"
    assert f'Operation cannot be fulfilled on resourceslices.resource.k8s.io "{name}"' in status["message"]
    assert (
        f"Precondition failed: UID in precondition: {OTHER_UID}, UID in object meta: {uid}"
        in status["message"]
    )
    with pytest.raises(client.ApiException) as stale:
        delete(uid=uid, resource_version="1")
    assert (
        f"ResourceVersion in precondition: 1, ResourceVersion in object meta: {version}"
        in json.loads(stale.value.body)["message"]
    )
    assert server.objects("resourceslices")

    deleted = delete(uid=uid, resource_version=version)
    assert deleted.metadata.uid == uid
    assert int(deleted.metadata.resource_version) > int(version)  # the revision of the deletion
    assert server.objects("resourceslices") == []


GATE_TEST_SLICES = [
    slice_body(
        devices=[
            {
                "name": "gpu-0",
                "allowMultipleAllocations": True,
                "capacity": {
                    "memory": {
                        "value": "80Gi",
                        "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi"}},
                    }
                },
                "consumesCounters": [
                    {"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}
                ],
                "taints": [{"key": "example.com/unhealthy", "value": "true", "effect": "NoSchedule"}],
            }
        ]
    ),
    slice_body(
        devices=None, sharedCounters=[{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
    ),
]
GATED_FIELDS = {
    "DRAConsumableCapacity": {
        "slices[0].spec.devices[0].allowMultipleAllocations",
        "slices[0].spec.devices[0].capacity.memory.requestPolicy",
    },
    "DRAPartitionableDevices": {
        "slices[0].spec.devices[0].consumesCounters",
        "slices[1].spec.sharedCounters",
    },
    "DRADeviceTaints": {"slices[0].spec.devices[0].taints"},
}


def dropped_on_create(server: ApiServer) -> set[str]:
    stored = []
    for body in GATE_TEST_SLICES:
        code, created = raw(server, "POST", SLICES, body)
        assert code == 201, created
        stored.append(created)
    return missing(GATE_TEST_SLICES, stored, "slices")


@pytest.mark.parametrize("gate", sorted(GATED_FIELDS))
def test_a_disabled_gate_drops_exactly_its_fields(make_server: Callable[..., ApiServer], gate: str) -> None:
    assert dropped_on_create(make_server(disabled_features={gate})) == GATED_FIELDS[gate]


def test_gates_default_to_off_in_1_34_and_on_later(make_server: Callable[..., ApiServer]) -> None:
    assert dropped_on_create(make_server(version="1.34")) == set().union(*GATED_FIELDS.values())
    assert dropped_on_create(make_server(version="1.35")) == set()
    with pytest.raises(ValueError, match="unknown feature gates"):
        ApiServer(disabled_features={"DRADeviceTaint"})


def test_per_device_node_selection_without_its_gate_leaves_an_invalid_slice(
    make_server: Callable[..., ApiServer],
) -> None:
    body = slice_body(
        nodeName=None, perDeviceNodeSelection=True, devices=[{"name": "gpu-0", "nodeName": "node-a"}]
    )

    assert raw(make_server(version="1.35"), "POST", SLICES, body)[0] == 201
    code, status = raw(make_server(version="1.34"), "POST", SLICES, body)
    assert code == 422 and "exactly one of `nodeName`" in status["message"]


def test_fields_already_in_use_survive_updates_after_their_gate_is_turned_off(server: ApiServer) -> None:
    _, created = raw(server, "POST", SLICES, GATE_TEST_SLICES[0])
    server.set_disabled_features({"DRADeviceTaints"})

    code, updated = raw(server, "PUT", f"{SLICES}/{created['metadata']['name']}", created)
    assert code == 200 and updated["spec"]["devices"][0]["taints"]
    assert "taints" not in raw(server, "POST", SLICES, GATE_TEST_SLICES[0])[1]["spec"]["devices"][0]
    assert server.disabled_features == {"DRADeviceTaints"}


def test_taints_get_their_time_added_unless_given(server: ApiServer) -> None:
    taints = [
        {"key": "example.com/a", "effect": "NoSchedule"},
        {"key": "example.com/b", "effect": "NoExecute", "timeAdded": "2025-01-02T03:04:05Z"},
    ]
    _, created = raw(server, "POST", SLICES, slice_body(devices=[{"name": "gpu-0", "taints": taints}]))

    stored = created["spec"]["devices"][0]["taints"]
    assert RFC3339_SECONDS.fullmatch(stored[0]["timeAdded"])
    assert stored[1]["timeAdded"] == "2025-01-02T03:04:05Z"


def test_objects_are_validated_with_the_schema_of_the_server_version(
    make_server: Callable[..., ApiServer],
) -> None:
    # List-type attributes are new in the 1.36 schema.
    body = slice_body(devices=[{"name": "gpu-0", "attributes": {"models": {"strings": ["H100", "H200"]}}}])
    old, new = make_server(version="1.34"), make_server(version="1.36")

    # 1.34 does not know `strings`: dropped as an unknown field, the attribute has no value left.
    code, status = raw(old, "POST", SLICES, body)
    assert code == 422 and "exactly one value must be specified" in status["message"]
    assert raw(new, "POST", SLICES, body)[0] == 201
    version = raw(old, "GET", "/version")[1]
    assert (version["major"], version["minor"], version["gitVersion"]) == ("1", "34", "v1.34.0")
    assert (old.schema_version, make_server(version="1.37").schema_version) == ("1.34.0", "1.37.0")
    with pytest.raises(ValueError, match="N >= 34"):
        ApiServer(version="1.33")


def test_slices_follow_the_real_validation_rules_json_schema_cannot_express(
    make_server: Callable[..., ApiServer],
) -> None:
    both = slice_body(sharedCounters=GATE_TEST_SLICES[1]["spec"]["sharedCounters"])
    assert raw(make_server(version="1.34"), "POST", SLICES, both)[0] == 201
    server = make_server(version="1.35")
    assert raw(server, "POST", SLICES, both)[0] == 422  # devices and counter sets in separate slices
    assert raw(server, "POST", SLICES, slice_body(allNodes=True))[0] == 422  # and nodeName

    _, created = raw(server, "POST", SLICES, slice_body())
    path = f"{SLICES}/{created['metadata']['name']}"
    code, same = raw(server, "PUT", path, created)
    assert code == 200 and same["metadata"]["generation"] == 1  # no spec change, same generation
    created["spec"]["pool"]["generation"] = 2
    code, changed = raw(server, "PUT", path, {**same, "spec": created["spec"]})
    assert code == 200 and changed["metadata"]["generation"] == 2
    moved = {**changed, "spec": {**changed["spec"], "nodeName": "node-b"}}
    code, status = raw(server, "PUT", path, moved)
    assert code == 422 and "spec.nodeName" in status["message"] and "immutable" in status["message"]


def test_events_are_created_listed_and_selected(server: ApiServer, tmp_path: Path) -> None:
    api_client = config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    events = client.CoreV1Api(api_client)
    created = events.create_namespaced_event("default", event_body())
    events.create_namespaced_event("default", event_body("Stopped"))

    assert created.metadata.name.startswith("node-a.") and created.metadata.namespace == "default"
    assert events.read_namespaced_event(created.metadata.name, "default").reason == "Started"
    selected = events.list_namespaced_event("default", field_selector="reason=Stopped,source=dra-driver")
    assert [event.reason for event in selected.items] == ["Stopped"]
    assert len(events.list_event_for_all_namespaces(field_selector="involvedObject.name=node-a").items) == 2
    api_client.close()
    # An event about an object of another namespace belongs in that namespace.
    code, status = raw(server, "POST", EVENTS, event_body(involved_namespace="other"))
    assert code == 422 and "does not match event.namespace" in status["message"]


def test_writes_count_successful_writes_per_resource(server: ApiServer) -> None:
    _, created = raw(server, "POST", SLICES, slice_body())
    raw(server, "PUT", f"{SLICES}/{created['metadata']['name']}", created)
    raw(server, "POST", SLICES, slice_body(nodeName=None))  # invalid: not a write
    raw(server, "POST", CLAIMS, claim_body("c", ["gpu"]))
    raw(server, "DELETE", f"{SLICES}/{created['metadata']['name']}")

    assert (server.writes("resourceslices"), server.writes("resourceclaims")) == (3, 1)
    assert server.request_count("POST", "resourceslices") == 2
    server.reset_counts()
    assert (server.writes("resourceslices"), server.request_count("POST", "resourceslices")) == (0, 0)
    with pytest.raises(ValueError, match="serves no"):
        server.writes("resourceslice")


def test_objects_are_copies_sorted_by_name(server: ApiServer) -> None:
    for name in ("b", "a"):
        body = slice_body()
        body["metadata"] = {"name": name}
        raw(server, "POST", SLICES, body)

    listed = server.objects("resourceslices")
    assert [obj["metadata"]["name"] for obj in listed] == ["a", "b"]
    listed[0]["spec"]["driver"] = "changed.example.com"
    assert server.objects("resourceslices")[0]["spec"]["driver"] == DRIVER


def test_conflict_next_refuses_updates_and_deletes_without_writing(server: ApiServer) -> None:
    _, created = raw(server, "POST", SLICES, slice_body())
    path = f"{SLICES}/{created['metadata']['name']}"
    server.faults.conflict_next = 2

    code, status = raw(server, "PUT", path, created)
    assert (code, status["reason"]) == (409, "Conflict")
    assert status["message"].endswith(
        "the object has been modified; please apply your changes to the latest version and try again"
    )
    assert raw(server, "DELETE", path)[0] == 409
    assert server.objects("resourceslices") == [created]
    assert raw(server, "PUT", path, created)[0] == 200


def test_fail_after_commit_stores_the_write_but_answers_500(server: ApiServer) -> None:
    server.faults.fail_after_commit_next = 1

    code, status = raw(server, "POST", SLICES, slice_body())
    assert (code, status["reason"]) == (500, "InternalError")
    assert len(server.objects("resourceslices")) == 1
    assert server.writes("resourceslices") == 0
    assert raw(server, "POST", SLICES, slice_body())[0] == 201  # a careless retry duplicates
    assert len(server.objects("resourceslices")) == 2


def test_fail_methods_limits_which_requests_fail(server: ApiServer) -> None:
    server.faults.fail_next, server.faults.fail_status = 1, 503
    server.faults.fail_methods = frozenset({"POST"})

    assert raw(server, "GET", SLICES)[0] == 200
    code, status = raw(server, "POST", SLICES, slice_body())
    assert (code, status["reason"], status["message"]) == (503, "ServiceUnavailable", "injected fault")
    assert raw(server, "POST", SLICES, slice_body())[0] == 201


def test_pods_are_listed_by_label_node_and_phase_through_the_official_client(
    server: ApiServer, tmp_path: Path
) -> None:
    """What `dra-driver cleanup` asks before it deletes: the agent pods on a node."""
    api_client = config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    core = client.CoreV1Api(api_client)
    for name, app, node, phase in (
        ("agent-a", "dra-driver", "node-a", "Running"),
        ("agent-b", "dra-driver", "node-b", "Running"),
        ("done-a", "dra-driver", "node-a", "Succeeded"),
        ("web-a", "web", "node-a", "Running"),
    ):
        body = {
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }
        created = core.create_namespaced_pod("default", body)
        core.replace_namespaced_pod_status(
            name, "default", {**api_client.sanitize_for_serialization(created), "status": {"phase": phase}}
        )

    def names(label_selector: str, field_selector: str = "") -> list[str]:
        pods = core.list_pod_for_all_namespaces(label_selector=label_selector, field_selector=field_selector)
        return [pod.metadata.name for pod in pods.items]

    assert names("app.kubernetes.io/name=dra-driver") == ["agent-a", "agent-b", "done-a"]
    assert names("app.kubernetes.io/name!=dra-driver") == ["web-a"]
    assert names("app.kubernetes.io/name==dra-driver", "spec.nodeName=node-a,status.phase!=Succeeded") == [
        "agent-a"
    ]
    api_client.close()


@pytest.mark.parametrize(
    ("version", "field"), [("1.34", "spec.devices[1].name"), ("1.37", "spec.devices[1]")]
)
def test_a_duplicate_device_is_named_as_the_version_names_it(
    make_server: Callable[..., ApiServer], version: str, field: str
) -> None:
    body = slice_body(devices=[{"name": "gpu-0"}, {"name": "gpu-0"}])

    code, status = raw(make_server(version=version), "POST", SLICES, body)

    assert (code, [cause["field"] for cause in status["details"]["causes"]]) == (422, [field])
