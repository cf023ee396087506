"""Fixtures of the e2e tests: the test namespace, the node with the agent, and running an example
from deploy/examples to completion, then deleting it and waiting until nothing of its claims is
left (no claim, record, CDI spec or MPS daemon pod), so that the next test finds every device
free."""

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import kube, released
from tests.e2e.deploy import NODE_LABEL
from tests.support.examples import Report, documents, example_path, parse_report

NAMESPACE = "dra-driver-e2e"


@dataclass(frozen=True, slots=True)
class ExampleRun:
    pod: dict[str, Any]
    # Per container, what it printed.
    reports: dict[str, Report]
    # The claim's allocation results of our driver.
    results: list[dict[str, Any]]
    # By claim name: the status.devices entries the agent wrote while the pod ran.
    device_status: dict[str, list[dict[str, Any]]]
    # The UIDs of the pod's claims as they were allocated.
    claim_uids: tuple[str, ...]

    @property
    def node(self) -> str:
        node: str = self.pod["spec"]["nodeName"]
        return node


RunExample = Callable[[str], ExampleRun]
RunCopies = Callable[[str, tuple[str, ...]], list[ExampleRun]]
RunObjects = Callable[[list[dict[str, Any]]], ExampleRun]


@pytest.fixture(scope="session")
def namespace() -> Iterator[str]:
    kube.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}], None)
    kube.wait_for_service_account(NAMESPACE)
    yield NAMESPACE
    kube.delete("namespace", NAMESPACE, None)


@pytest.fixture(scope="session")
def kubernetes_version() -> tuple[int, int]:
    return kube.server_version()


@pytest.fixture(scope="session")
def worker() -> str:
    """The node hack/kind-up.sh labelled for the agent."""
    nodes = kube.get("nodes", "--selector", "=".join(NODE_LABEL))["items"]
    assert len(nodes) == 1, f"expected one node labelled {'='.join(NODE_LABEL)}; run hack/kind-up.sh"
    name: str = nodes[0]["metadata"]["name"]
    return name


def _own_namespace(path: Path) -> str | None:
    """An example that brings its Namespace (admin access needs a labelled one) runs there."""
    names = [item["metadata"]["name"] for item in documents(path) if item["kind"] == "Namespace"]
    return names[0] if names else None


class _Runner:
    """Applies examples, waits for their pods and reads what they printed; deletes everything it
    applied at the end, and waits until the claims are released."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.cleanups: list[Callable[[], None]] = []
        self.watches: list[kube.ClaimWatch] = []
        self.pod_names: set[str] = set()

    def run(self, name: str, pod_names: tuple[str, ...] = ()) -> list[ExampleRun]:
        """The example's pods (most have one), or copies of its pod named `pod_names` created at
        once (each with its own claim from the template), run to completion."""
        path = example_path(name)
        own = _own_namespace(path)
        target = own or self.namespace
        apply_namespace = None if own else self.namespace
        if own:
            # Its pod is refused until the namespace's default ServiceAccount exists.
            kube.apply_objects([item for item in documents(path) if item["kind"] == "Namespace"], None)
            kube.wait_for_service_account(own)
        watch = kube.ClaimWatch(target)
        self.watches.append(watch)
        self.cleanups.append(watch.stop)
        self.cleanups.append(lambda: kube.delete_file(path, apply_namespace))
        pods = [item for item in documents(path) if item["kind"] == "Pod"]
        pod = pods[0]
        if pod_names:
            others = [item for item in documents(path) if item["kind"] != "Pod"]
            copies = [{**pod, "metadata": {**pod["metadata"], "name": copy}} for copy in pod_names]
            for copy in pod_names:
                self.cleanups.append(functools.partial(kube.delete, "pod", copy, target))
            kube.apply_objects([*others, *copies], apply_namespace)
        else:
            kube.apply_file(path, apply_namespace)
        names = pod_names or tuple(item["metadata"]["name"] for item in pods)
        self.pod_names.update(names)
        return [self._finished(pod_name, target, watch) for pod_name in names]

    def run_objects(self, objects: list[dict[str, Any]]) -> ExampleRun:
        """Objects of the test's own (claim templates and one pod) in the test namespace, the
        pod run to completion."""
        watch = kube.ClaimWatch(self.namespace)
        self.watches.append(watch)
        self.cleanups.append(watch.stop)
        for item in objects:
            kind, name = item["kind"].lower(), item["metadata"]["name"]
            self.cleanups.append(functools.partial(kube.delete, kind, name, self.namespace))
        kube.apply_objects(objects, self.namespace)
        (pod,) = [item for item in objects if item["kind"] == "Pod"]
        self.pod_names.add(pod["metadata"]["name"])
        return self._finished(pod["metadata"]["name"], self.namespace, watch)

    @staticmethod
    def _finished(pod_name: str, namespace: str, watch: kube.ClaimWatch) -> ExampleRun:
        pod = kube.wait_for_pod(pod_name, namespace)
        reports = {
            container["name"]: parse_report(kube.logs(pod_name, namespace, container["name"]))
            for container in pod["spec"]["containers"]
        }
        results = kube.allocation_results(pod, watch)
        claims = watch.claims_of(pod)
        names = [claim["metadata"]["name"] for claim in claims]
        return ExampleRun(
            pod,
            reports,
            results,
            {name: watch.device_status.get(name, []) for name in names},
            tuple(claim["metadata"]["uid"] for claim in claims),
        )

    def close(self) -> None:
        """Everything applied deleted; then every claim seen allocated released on its node."""
        for cleanup in reversed(self.cleanups):
            cleanup()
        released.wait_until_released(
            uid for watch in self.watches for uid in watch.allocated_uids(self.pod_names)
        )


@pytest.fixture
def runner(namespace: str) -> Iterator[_Runner]:
    examples = _Runner(namespace)
    yield examples
    examples.close()


@pytest.fixture
def run_example(runner: _Runner) -> RunExample:
    """run_example(name): applies deploy/examples/<name>.yaml, waits for its pod to succeed and
    reads what it printed."""

    def run(name: str) -> ExampleRun:
        (only,) = runner.run(name)
        return only

    return run


@pytest.fixture
def run_objects(runner: _Runner) -> RunObjects:
    """run_objects(objects): claim templates and a pod of the test's own, run like an example."""
    return runner.run_objects


@pytest.fixture
def run_copies(runner: _Runner) -> RunCopies:
    """run_copies(name, pod_names): the example's pod as several pods created at once."""
    return runner.run


def _gpu_pod(name: str, command: list[str]) -> list[dict[str, Any]]:
    """gpu-whole.yaml's template and pod, the pod renamed and running `command`."""
    items = documents(example_path("gpu-whole"))
    pod = next(item for item in items if item["kind"] == "Pod")
    container = {**pod["spec"]["containers"][0], "command": command}
    renamed = {
        **pod,
        "metadata": {**pod["metadata"], "name": name},
        "spec": {**pod["spec"], "containers": [container]},
    }
    return [*(item for item in items if item["kind"] != "Pod"), renamed]


@pytest.fixture
def long_running(namespace: str) -> Iterator[Callable[[str], dict[str, Any]]]:
    """long_running(name): a whole-GPU pod that sleeps, once it runs; deleted afterwards, and its
    claim released."""
    names: list[str] = []
    claim_uids: list[str] = []

    def start(name: str) -> dict[str, Any]:
        names.append(name)
        kube.apply_objects(_gpu_pod(name, ["sleep", "3600"]), namespace)
        pod = wait_phase(name, namespace, "Running")
        for claim in kube.get("resourceclaims.resource.k8s.io", "--namespace", namespace)["items"]:
            owners = {owner["uid"] for owner in claim["metadata"].get("ownerReferences", [])}
            if pod["metadata"]["uid"] in owners:
                claim_uids.append(claim["metadata"]["uid"])
        return pod

    yield start
    for name in names:
        kube.delete("pod", name, namespace)
    released.wait_until_released(claim_uids)


def wait_phase(name: str, namespace: str, phase: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = kube.get("pod", name, "--namespace", namespace)
        if pod.get("status", {}).get("phase") == phase:
            return pod
        if time.monotonic() > deadline:
            described = kube.kubectl("describe", "pod", name, "--namespace", namespace)
            raise AssertionError(f"pod {name} not {phase} after {timeout:.0f}s:\n{described}")
        time.sleep(1)
