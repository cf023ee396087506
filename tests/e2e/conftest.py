"""Fixtures of the kind e2e tests: the test namespace, the node with the agent, and running an
example from deploy/examples to completion (and deleting it afterwards, so that the next test
finds every device free)."""

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

    @property
    def node(self) -> str:
        node: str = self.pod["spec"]["nodeName"]
        return node


RunExample = Callable[..., ExampleRun]


@pytest.fixture(scope="session")
def namespace() -> Iterator[str]:
    kube.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}], None)
    yield NAMESPACE
    kube.delete("namespace", NAMESPACE, None)


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


@pytest.fixture
def run_example(namespace: str) -> Iterator[RunExample]:
    """run_example(name, pod_name=None): applies deploy/examples/<name>.yaml (again with only the
    pod renamed when `pod_name` is given), waits for the pod to succeed and reads what it printed."""
    cleanups: list[Callable[[], None]] = []

    def run(name: str, pod_name: str | None = None) -> ExampleRun:
        path = example_path(name)
        own = _own_namespace(path)
        target = own or namespace
        apply_namespace = None if own else namespace
        if pod_name is None:
            cleanups.append(lambda: kube.delete_file(path, apply_namespace))
            kube.apply_file(path, apply_namespace)
            pod_name = next(item for item in documents(path) if item["kind"] == "Pod")["metadata"]["name"]
        else:
            pod = next(item for item in documents(path) if item["kind"] == "Pod")
            pod["metadata"]["name"] = pod_name
            renamed = pod_name
            cleanups.append(lambda: kube.delete("pod", renamed, target))
            kube.apply_objects([pod], apply_namespace)
        pod = kube.wait_for_pod(pod_name, target)
        reports = {
            container["name"]: parse_report(kube.logs(pod_name, target, container["name"]))
            for container in pod["spec"]["containers"]
        }
        return ExampleRun(pod=pod, reports=reports, results=kube.allocation_results(pod))

    yield run
    for cleanup in reversed(cleanups):
        cleanup()
