"""Which containers use which of our devices: kubelet's PodResources API (v1 List).

Synchronous gRPC on purpose: the usage sampler calls it from its own thread, with a deadline, so
a kubelet that does not answer delays a sample and nothing else.
"""

from pathlib import Path

import grpc

from dra_driver._proto.podresources.v1 import api_pb2, api_pb2_grpc
from dra_driver.base.errors import TransientFault
from dra_driver.usage.attribution import DeviceUser

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
CALL_TIMEOUT_SECONDS = 5.0


class PodResourcesUnavailable(TransientFault):
    """kubelet's PodResources socket did not answer (missing, refused, or too slow)."""


def device_users(response: api_pb2.ListPodResourcesResponse, driver_name: str) -> tuple[DeviceUser, ...]:
    """The containers using `driver_name`'s devices, from a List answer (pure)."""
    users = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    if resource.driver_name != driver_name:
                        continue
                    users.append(
                        DeviceUser(
                            namespace=dynamic.claim_namespace or pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            claim=dynamic.claim_name,
                            pool=resource.pool_name,
                            device=resource.device_name,
                            share_id=resource.share_id if resource.HasField("share_id") else None,
                        )
                    )
    return tuple(users)


class PodResourcesClient:
    """One channel to kubelet's socket, kept open between samples."""

    def __init__(self, socket: Path, timeout: float = CALL_TIMEOUT_SECONDS) -> None:
        self._socket = socket
        self._timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list_users(self, driver_name: str) -> tuple[DeviceUser, ...]:
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as error:
            raise PodResourcesUnavailable(
                f"kubelet PodResources {self._socket}: {error.code().name}"
            ) from error
        return device_users(response, driver_name)

    def close(self) -> None:
        self._channel.close()
