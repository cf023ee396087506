"""`dra-driver kubelet-client`: the kubelet side of the plugin protocols, for debugging a node.

It does what kubelet does, with kubelet's timeouts: the registration handshake (GetInfo,
checks, NotifyRegistrationStatus) and NodePrepareResources / NodeUnprepareResources calls
against any DRA plugin socket. Tests drive the agent through it, so it is held to the contract.
"""

import asyncio
import time
from pathlib import Path
from typing import Any, Literal

import grpc
import msgspec
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver._proto.pluginregistration.v1 import api_pb2 as registration_pb2
from dra_driver._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from dra_driver.base.errors import TransientFault

# Kubelet's timeouts (pluginmanager operation_generator.go, cm/dra/plugin).
GET_INFO_TIMEOUT_SECONDS = 1.0
NOTIFY_TIMEOUT_SECONDS = 5.0
DRA_CALL_TIMEOUT_SECONDS = 45.0
KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")

DraApi = Literal["v1", "v1beta1"]
_DRA_MODULES = {"v1": (v1_pb2, v1_grpc), "v1beta1": (v1beta1_pb2, v1beta1_grpc)}


class KubeletClientError(TransientFault, RuntimeError):
    """A call failed at the gRPC level, or the plugin broke the contract."""


class ClaimArg(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str

    @classmethod
    def parse(cls, text: str) -> "ClaimArg":
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"claim {text!r}: expected <namespace>/<name>/<uid>")
        return cls(*parts)


def _as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def _describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name}: {error.details()}"


def select_dra_service(supported_versions: list[str]) -> str | None:
    """Kubelet >= 1.34 walks the plugin's list in order and takes the first service it knows."""
    return next((version for version in supported_versions if version in KUBELET_DRA_SERVICES), None)


def _kubelet_checks(info: registration_pb2.PluginInfo) -> tuple[str | None, list[str]]:
    """The DRA service kubelet would pick, and why kubelet would refuse the plugin."""
    service = select_dra_service(list(info.supported_versions))
    problems = []
    if info.type != "DRAPlugin":
        problems.append(f"plugin type {info.type!r} is not 'DRAPlugin'")
    if not info.name:
        problems.append("plugin name is empty")
    if service is None:
        problems.append(f"none of {list(info.supported_versions)} is a DRA service kubelet supports")
    return service, problems


async def _get_info(
    stub: registration_grpc.RegistrationStub, registration_socket: Path
) -> registration_pb2.PluginInfo:
    try:
        info: registration_pb2.PluginInfo = await stub.GetInfo(
            registration_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT_SECONDS
        )
    except grpc.aio.AioRpcError as error:
        raise KubeletClientError(f"GetInfo on {registration_socket}: {_describe(error)}") from error
    return info


async def plugin_info(registration_socket: Path) -> dict[str, Any]:
    """GetInfo and kubelet's checks, without NotifyRegistrationStatus: a plugin told it is
    registered reports itself ready (its /readyz), so a look at a node must not tell it so
    when kubelet never did."""
    async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
        info = await _get_info(registration_grpc.RegistrationStub(channel), registration_socket)
    service, problems = _kubelet_checks(info)
    return {
        "pluginInfo": _as_dict(info),
        "endpoint": info.endpoint or str(registration_socket),
        "selectedService": service,
        "kubeletWouldRegister": not problems,
        "error": "; ".join(problems),
        "notified": False,
    }


async def register(registration_socket: Path, reject_reason: str = "") -> dict[str, Any]:
    """Kubelet's registration sequence. With `reject_reason`, registration is refused like kubelet would."""
    async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
        stub = registration_grpc.RegistrationStub(channel)
        info = await _get_info(stub, registration_socket)
        service, problems = _kubelet_checks(info)
        error_text = reject_reason or "; ".join(problems)
        notify_error = ""
        try:
            await stub.NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=not error_text, error=error_text),
                timeout=NOTIFY_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as error:
            notify_error = _describe(error)
    return {
        "pluginInfo": _as_dict(info),
        "endpoint": info.endpoint or str(registration_socket),
        "selectedService": service,
        "registered": not error_text,
        "error": error_text,
        "notified": True,
        "notifyResponseError": notify_error,
    }


async def _dra_call(dra_socket: Path, api: DraApi, method: str, claims: list[ClaimArg]) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
        response = await _dra_rpc(channel, str(dra_socket), api, method, claims)
    return _dra_answer(response, api, method, claims)


async def _dra_rpc(
    channel: grpc.aio.Channel, where: str, api: DraApi, method: str, claims: list[ClaimArg]
) -> Message:
    pb2, grpc_module = _DRA_MODULES[api]
    request_type = getattr(pb2, f"{method}Request")
    request = request_type(claims=[pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims])
    stub = grpc_module.DRAPluginStub(channel)
    try:
        response: Message = await getattr(stub, method)(request, timeout=DRA_CALL_TIMEOUT_SECONDS)
    except grpc.aio.AioRpcError as error:
        raise KubeletClientError(f"{api} {method} on {where}: {_describe(error)}") from error
    return response


def _dra_answer(response: Message, api: DraApi, method: str, claims: list[ClaimArg]) -> dict[str, Any]:
    answer = _as_dict(response)
    asked = {claim.uid for claim in claims}
    answered = set(answer.get("claims", {}))
    if asked != answered:
        raise KubeletClientError(
            f"{api} {method}: answer covers claims {sorted(answered)}, request had {sorted(asked)}"
        )
    return answer


async def prepare(dra_socket: Path, api: DraApi, claims: list[ClaimArg]) -> dict[str, Any]:
    return await _dra_call(dra_socket, api, "NodePrepareResources", claims)


async def unprepare(dra_socket: Path, api: DraApi, claims: list[ClaimArg]) -> dict[str, Any]:
    return await _dra_call(dra_socket, api, "NodeUnprepareResources", claims)


async def timed_prepare(
    dra_socket: Path, api: DraApi, claims: list[ClaimArg]
) -> tuple[dict[str, Any], float]:
    """`prepare`, and the seconds of its call alone: on a channel connected before the clock
    starts, as kubelet's lasting connection is, and without reading the answer into a dict (whose
    first use imports protobuf's descriptor module: 4 ms with bytecode, some 40 ms without, on
    the first GPU machine). What the plugin took, not this process's first steps."""
    async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
        await asyncio.wait_for(channel.channel_ready(), DRA_CALL_TIMEOUT_SECONDS)
        started = time.perf_counter()
        response = await _dra_rpc(channel, str(dra_socket), api, "NodePrepareResources", claims)
        seconds = time.perf_counter() - started
    return _dra_answer(response, api, "NodePrepareResources", claims), seconds
