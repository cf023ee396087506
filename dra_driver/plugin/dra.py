"""DRAPlugin v1 and v1beta1: two thin adapters over one claim engine.

The two versions have the same messages (v1 adds `share_id`), so each adapter only knows which
generated module to build its answer from.
"""

from types import ModuleType
from typing import Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.claims.engine import ClaimEngine, RawClaim


def _raw_claims(request: Any) -> list[RawClaim]:
    return [RawClaim(claim.namespace, claim.name, claim.uid) for claim in request.claims]


class _DraPluginAdapter:
    pb2: ModuleType

    has_share_id = False

    def __init__(self, engine: ClaimEngine) -> None:
        self._engine = engine

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        outcomes = await self._engine.prepare(_raw_claims(request))
        response = self.pb2.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                added = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if device.share_id and self.has_share_id:
                    added.share_id = device.share_id
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        errors = await self._engine.unprepare(_raw_claims(request))
        response = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class DraPluginV1(_DraPluginAdapter):
    pb2 = v1_pb2
    # v1 Device.share_id (field 5, Kubernetes 1.35): which share of a shareable device this is.
    has_share_id = True


class DraPluginV1beta1(_DraPluginAdapter):
    pb2 = v1beta1_pb2


def add_dra_services(server: grpc.aio.Server, engine: ClaimEngine) -> None:
    v1_grpc.add_DRAPluginServicer_to_server(DraPluginV1(engine), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DraPluginV1beta1(engine), server)
