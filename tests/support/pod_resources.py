"""A stand-in for kubelet's PodResources server: real gRPC on a real unix socket, answering List
and Get from pods a test sets (and changes, as pods come and go)."""

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from dra_driver._proto.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass(frozen=True)
class UsedDevice:
    """One container's use of one device of a claim."""

    container: str
    claim: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    devices: Sequence[UsedDevice]


def pod_resources(pod: Pod) -> api_pb2.PodResources:
    containers: dict[str, api_pb2.ContainerResources] = {}
    for used in pod.devices:
        container = containers.setdefault(used.container, api_pb2.ContainerResources(name=used.container))
        resource = api_pb2.ClaimResource(
            cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{used.driver}/claim={used.claim}")],
            driver_name=used.driver,
            pool_name=used.pool,
            device_name=used.device,
        )
        if used.share_id is not None:
            resource.share_id = used.share_id
        container.dynamic_resources.append(
            api_pb2.DynamicResource(
                claim_name=used.claim, claim_namespace=pod.namespace, claim_resources=[resource]
            )
        )
    return api_pb2.PodResources(name=pod.name, namespace=pod.namespace, containers=list(containers.values()))


class StandInKubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: tuple[Pod, ...] = ()
        self.list_calls = 0

    def set_pods(self, pods: Sequence[Pod]) -> None:
        with self._lock:
            self._pods = tuple(pods)

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        with self._lock:
            self.list_calls += 1
            pods = self._pods
        return api_pb2.ListPodResourcesResponse(pod_resources=[pod_resources(pod) for pod in pods])

    def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        with self._lock:
            pods = self._pods
        for pod in pods:
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=pod_resources(pod))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable")


@contextmanager
def serve_pod_resources(socket: Path) -> Iterator[StandInKubelet]:
    kubelet = StandInKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield kubelet
    finally:
        server.stop(grace=None)


def main() -> None:
    """`python -m tests.support.pod_resources <socket> <pods.json>`: serves until stdin closes, so a
    benchmark can keep the stand-in kubelet's memory and threads out of the process it measures."""
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    socket, pods_file = Path(sys.argv[1]), Path(sys.argv[2])
    pods = [
        Pod(pod["namespace"], pod["name"], [UsedDevice(**used) for used in pod["devices"]])
        for pod in json.loads(pods_file.read_text())
    ]
    with serve_pod_resources(socket) as kubelet:
        kubelet.set_pods(pods)
        print("serving", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
