"""Fixtures of the kind e2e tests: the test namespace, the node with the agent, and running an
example from deploy/examples to completion (and deleting it afterwards, so that the next test
finds every device free)."""

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import kube
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

    @property
    def node(self) -> str:
        node: str = self.pod["spec"]["nodeName"]
        return node


RunExample = Callable[[str], ExampleRun]
RunCopies = Callable[[str, tuple[str, ...]], list[ExampleRun]]


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
    applied at the end, so that the next test finds every device free."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.cleanups: list[Callable[[], None]] = []

    def run(self, name: str, pod_names: tuple[str, ...] = ()) -> list[ExampleRun]:
        """The example's pod, or copies of it named `pod_names` created at once (each with its
        own claim from the template), run to completion."""
        path = example_path(name)
        own = _own_namespace(path)
        target = own or self.namespace
        apply_namespace = None if own else self.namespace
        if own:
            # Its pod is refused until the namespace's default ServiceAccount exists.
            kube.apply_objects([item for item in documents(path) if item["kind"] == "Namespace"], None)
            kube.wait_for_service_account(own)
        watch = kube.ClaimWatch(target)
        self.cleanups.append(watch.stop)
        self.cleanups.append(lambda: kube.delete_file(path, apply_namespace))
        pod = next(item for item in documents(path) if item["kind"] == "Pod")
        if pod_names:
            others = [item for item in documents(path) if item["kind"] != "Pod"]
            copies = [{**pod, "metadata": {**pod["metadata"], "name": copy}} for copy in pod_names]
            for copy in pod_names:
                self.cleanups.append(functools.partial(kube.delete, "pod", copy, target))
            kube.apply_objects([*others, *copies], apply_namespace)
        else:
            kube.apply_file(path, apply_namespace)
        return [
            self._finished(pod_name, target, watch) for pod_name in pod_names or (pod["metadata"]["name"],)
        ]

    @staticmethod
    def _finished(pod_name: str, namespace: str, watch: kube.ClaimWatch) -> ExampleRun:
        pod = kube.wait_for_pod(pod_name, namespace)
        reports = {
            container["name"]: parse_report(kube.logs(pod_name, namespace, container["name"]))
            for container in pod["spec"]["containers"]
        }
        results = kube.allocation_results(pod, watch)
        names = [claim["metadata"]["name"] for claim in watch.claims_of(pod)]
        return ExampleRun(pod, reports, results, {name: watch.device_status.get(name, []) for name in names})


@pytest.fixture
def runner(namespace: str) -> Iterator[_Runner]:
    examples = _Runner(namespace)
    yield examples
    for cleanup in reversed(examples.cleanups):
        cleanup()


@pytest.fixture
def run_example(runner: _Runner) -> RunExample:
    """run_example(name): applies deploy/examples/<name>.yaml, waits for its pod to succeed and
    reads what it printed."""

    def run(name: str) -> ExampleRun:
        (only,) = runner.run(name)
        return only

    return run


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
    """long_running(name): a whole-GPU pod that sleeps, once it runs; deleted afterwards."""
    names: list[str] = []

    def start(name: str) -> dict[str, Any]:
        names.append(name)
        kube.apply_objects(_gpu_pod(name, ["sleep", "3600"]), namespace)
        return wait_phase(name, namespace, "Running")

    yield start
    for name in names:
        kube.delete("pod", name, namespace)


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
