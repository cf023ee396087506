"""A DRAPlugin v1 server that does no work: the floor of the latency harness.

It answers every NodePrepareResources / NodeUnprepareResources at once with a plausible answer
of the size the agent's would have (one entry per claim of the call, one whole GPU each), so the
time it takes is the client, gRPC, protobuf and the unix socket alone, for calls of any size.
"""

import argparse
import asyncio
from typing import Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc


class NullPlugin:
    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = v1_pb2.NodePrepareResourcesResponse()
        for position, claim in enumerate(request.claims):
            # The n-th claim of a call gets GPU n, as distinct devices would be in the agent's answer.
            response.claims[claim.uid].devices.add(
                request_names=["gpu"],
                pool_name="node-a",
                device_name=f"gpu-{position}",
                cdi_device_ids=[f"k8s.gpu.dra-driver.dev/claim={claim.uid}-gpu-{position}"],
            )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            # Reading a message-valued map entry creates it: an entry with no error is success.
            response.claims[claim.uid].error = ""
        return response


async def serve(socket_path: str) -> None:
    server = grpc.aio.server()
    v1_grpc.add_DRAPluginServicer_to_server(NullPlugin(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("socket")
    asyncio.run(serve(parser.parse_args().socket))
