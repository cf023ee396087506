"""The kubelet plugin-registration service (pluginregistration.Registration)."""

import asyncio
from typing import Any

import grpc
import msgspec
import structlog

from dra_driver._proto.pluginregistration.v1 import api_pb2 as registration_pb2

log = structlog.get_logger("dra_driver.plugin.registration")

PLUGIN_TYPE = "DRAPlugin"
# Kubelet >= 1.34 takes the first DRAPlugin entry it supports, so the newest API comes first. The
# health services follow: kubelet 1.37 picks one of them from this list (v1 before v1alpha1), and
# earlier kubelets ignore entries they do not know.
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)


class RegistrationStatus(msgspec.Struct, frozen=True):
    registered: bool
    error: str


class RegistrationService:
    def __init__(self, driver_name: str, endpoint: str) -> None:
        self._info = registration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=driver_name, endpoint=endpoint, supported_versions=SUPPORTED_VERSIONS
        )
        self.status: RegistrationStatus | None = None
        self.status_changed = asyncio.Event()

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> registration_pb2.PluginInfo:
        log.debug("kubelet asked for plugin info")
        return self._info

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> registration_pb2.RegistrationStatusResponse:
        self.status = RegistrationStatus(registered=request.plugin_registered, error=request.error)
        self.status_changed.set()
        if request.plugin_registered:
            log.info("registered with kubelet", endpoint=self._info.endpoint)
            return registration_pb2.RegistrationStatusResponse()
        log.error("kubelet rejected the registration", kubelet_error=request.error)
        # As the upstream helper does: an error status makes the rejection visible in kubelet's log too.
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"registration rejected: {request.error}")
