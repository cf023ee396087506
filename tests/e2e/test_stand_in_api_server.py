"""The stand-in API server (tests/support/apiserver.py) answers as the real one does.

The same requests go to the local cluster's kube-apiserver and to the stand-in of the same minor
version with the same feature gates: ResourceSlices and ResourceClaims created, updated with a
stale resourceVersion, deleted with a failed precondition, invalid in the ways the driver could
make them invalid, with an unknown field under strict and default field validation. Each answer
is compared by what a client acts on: the HTTP status, the Status reason, the fields an Invalid
answer names, whether a warning came, and what a created object kept. A difference is a bug in the
stand-in, which every other test tier trusts.

Local provider only: the stand-in is given the gates this cluster turns on (tests/cluster/versions).
"""

import copy
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from tests.cluster.versions import kubernetes_version
from tests.support.apiserver import ApiServer, default_disabled_features

if os.environ.get("E2E_PROVIDER") != "local":
    pytest.skip("the stand-in gets the local cluster's feature gates (make e2e)", allow_module_level=True)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CHECK_DRIVER = "stand-in-check.example.com"
UNUSED_UID = "00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    invalid_fields: tuple[str, ...]
    warned: bool
    body: dict[str, Any]


class Server:
    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self.host = configuration.host
        self.client = kubernetes.client.ApiClient(configuration)
        # The local cluster's kubeconfig authenticates by client certificate (the TLS pool has it);
        # a token, where a kubeconfig has one, goes in the header.
        self.token = configuration.api_key.get("authorization")

    def call(self, method: str, path: str, body: Any = None) -> Answer:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = self.token
        response = self.client.rest_client.request(
            method, self.host + path, headers=headers, body=body, _request_timeout=30
        )
        data = json.loads(response.read() or b"{}")
        causes = data.get("details", {}).get("causes", []) if data.get("kind") == "Status" else []
        return Answer(
            status=response.status,
            reason=data.get("reason", "") if data.get("kind") == "Status" else "",
            invalid_fields=tuple(sorted({cause.get("field", "") for cause in causes})),
            warned=bool(response.headers.get("Warning")),
            body=data,
        )


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    version = kubernetes_version()
    minor = int(version.minor.split(".")[1])
    stand_in = ApiServer(
        version.minor, disabled_features=default_disabled_features(minor) - set(version.feature_gates)
    )
    stand_in.start()
    kubernetes.config.load_kube_config()
    real = kubernetes.client.Configuration.get_default_copy()
    fake = kubernetes.client.Configuration(host=stand_in.url)
    try:
        yield Server(real), Server(fake)
    finally:
        stand_in.stop()


def _slice(name: str, devices: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": CHECK_DRIVER,
            "pool": {"name": "pool", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": devices if devices is not None else [{"name": "device-0"}],
            **spec,
        },
    }


def _claim(name: str, request: str = "gpu") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": request, "exactly": {"deviceClassName": "gpu.example.com"}}]}
        },
    }


def _both(servers: tuple[Server, Server], steps: list[tuple[str, str, Any]]) -> list[tuple[Answer, Answer]]:
    """Each step on both servers; `{rv}` in a body's resourceVersion is the one the object had
    after the first step."""
    answers: list[tuple[Answer, Answer]] = []
    first: dict[int, str] = {}
    for method, path, body in steps:
        pair = []
        for index, server in enumerate(servers):
            sent = copy.deepcopy(body)
            if isinstance(sent, dict) and sent.get("metadata", {}).get("resourceVersion") == "{rv}":
                sent["metadata"]["resourceVersion"] = first[index]
            answer = server.call(method, path, sent)
            if not answers and "metadata" in answer.body:
                first[index] = answer.body["metadata"].get("resourceVersion", "")
            pair.append(answer)
        answers.append((pair[0], pair[1]))
    return answers


def _agree(answers: list[tuple[Answer, Answer]]) -> None:
    seen = [
        (
            (real.status, real.reason, real.invalid_fields, real.warned),
            (fake.status, fake.reason, fake.invalid_fields, fake.warned),
        )
        for real, fake in answers
    ]
    assert [real for real, _ in seen] == [fake for _, fake in seen], [
        (real_answer.body, fake_answer.body) for real_answer, fake_answer in answers
    ]


def test_a_slice_is_created_once_read_and_deleted(servers: tuple[Server, Server]) -> None:
    name = "stand-in-check-lifecycle"
    _agree(
        _both(
            servers,
            [
                ("POST", SLICES, _slice(name)),
                ("POST", SLICES, _slice(name)),
                ("GET", f"{SLICES}/{name}", None),
                ("DELETE", f"{SLICES}/{name}", {"preconditions": {"uid": UNUSED_UID}}),
                ("DELETE", f"{SLICES}/{name}", None),
                ("GET", f"{SLICES}/{name}", None),
            ],
        )
    )


def test_an_update_from_a_stale_resource_version_conflicts(servers: tuple[Server, Server]) -> None:
    name = "stand-in-check-stale"
    updated = _slice(name, [{"name": "device-0"}, {"name": "device-1"}])
    updated["metadata"]["resourceVersion"] = "{rv}"
    answers = _both(
        servers,
        [
            ("POST", SLICES, _slice(name)),
            ("PUT", f"{SLICES}/{name}", updated),
            ("PUT", f"{SLICES}/{name}", updated),
            ("DELETE", f"{SLICES}/{name}", None),
        ],
    )
    _agree(answers)


@pytest.mark.parametrize("validation", ["Strict", "Warn", None])
def test_an_unknown_field_is_treated_as_the_field_validation_asks(
    servers: tuple[Server, Server], validation: str | None
) -> None:
    name = f"stand-in-check-unknown-{(validation or 'default').lower()}"
    body = _slice(name, [{"name": "device-0", "unknownField": 1}])
    query = f"?fieldValidation={validation}" if validation else ""
    answers = _both(servers, [("POST", SLICES + query, body), ("DELETE", f"{SLICES}/{name}", None)])
    _agree(answers)
    for real, fake in answers[:1]:
        if real.status == 201:
            assert list(real.body["spec"]["devices"]) == fake.body["spec"]["devices"]


@pytest.mark.parametrize(
    ("case", "devices", "spec", "status"),
    [
        ("device-name", [{"name": "Device_0"}], {}, 422),
        ("too-many-devices", [{"name": f"device-{index}"} for index in range(129)], {}, 422),
        ("duplicate-device", [{"name": "device-0"}, {"name": "device-0"}], {}, 422),
        ("no-node-selection", None, {"allNodes": None}, 422),
        ("two-node-selections", None, {"nodeName": "node-a"}, 422),
        # A quantity that does not parse fails decoding, before validation.
        ("bad-capacity", [{"name": "device-0", "capacity": {"memory": {"value": "lots"}}}], {}, 400),
        (
            "attribute-two-values",
            [{"name": "device-0", "attributes": {"a": {"int": 1, "string": "x"}}}],
            {},
            422,
        ),
    ],
)
def test_an_invalid_slice_is_refused_naming_the_same_fields(
    servers: tuple[Server, Server],
    case: str,
    devices: list[dict[str, Any]] | None,
    spec: dict[str, Any],
    status: int,
) -> None:
    body = _slice(f"stand-in-check-{case}", devices, **spec)
    body["spec"] = {key: value for key, value in body["spec"].items() if value is not None}
    answers = _both(servers, [("POST", SLICES, body)])
    _agree(answers)
    assert answers[0][0].status == status


def test_a_claims_spec_is_immutable_and_its_status_separate(servers: tuple[Server, Server]) -> None:
    namespace = "default"
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    name = "stand-in-check-claim"
    changed = _claim(name, request="other")
    changed["metadata"]["resourceVersion"] = "{rv}"
    status = _claim(name)
    status["metadata"]["resourceVersion"] = "{rv}"
    status["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": CHECK_DRIVER, "pool": "pool", "device": "device-0"}]
            }
        }
    }
    _agree(
        _both(
            servers,
            [
                ("POST", claims, _claim(name)),
                ("PUT", f"{claims}/{name}", changed),
                ("PUT", f"{claims}/{name}/status", status),
                ("POST", claims, _claim("stand-in-check-bad-request", request="GPU_0")),
                ("DELETE", f"{claims}/{name}", None),
            ],
        )
    )
