"""CDI specs: one transient spec file per prepared claim, and one node-wide spec per node.

Container runtimes resolve the IDs we hand to kubelet against these files. Each spec states the
*minimum* CDI version its content needs, because a runtime rejects a spec whose version it does
not know (podman 4.3.1 stops at 0.5.0) even when nothing in it needs the newer version.

What every GPU container needs whatever it was allocated (control device nodes, the driver's
libraries and tools) lives in the node spec, written once when the agent starts, so claim specs
stay small and a driver upgrade rewrites one file instead of every claim's. Prepare hands out the
node spec's single device next to the claim's own devices.

This module builds and names specs and touches no file: the claim planners build container edits
with it, and they must not import the disk layer. `cdi_files` writes the specs.
"""

import re
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

import msgspec

from dra_driver.base.errors import ClaimFault
from dra_driver.observability.error_reasons import ErrorReason

CLAIM_CLASS = "claim"
NODE_CLASS = "node"
COMMON_DEVICE = "common"
SPEC_SUFFIX = ".json"

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_STARTS_WITH_LETTER = re.compile(r"[A-Za-z]")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?")

# The OCI hook points the CDI library accepts; any other name makes it refuse the whole spec.
HookName = Literal["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"]


class InvalidCdiName(ClaimFault, ValueError):
    """A name the CDI rules (and so every container runtime) would refuse."""

    # Identity: a name is built from the claim's UID and device names, and breaks the rules only
    # when those do.
    metric_reason: ClassVar[ErrorReason] = "invalid_identity"


class DeviceNode(msgspec.Struct, frozen=True):
    """A device node at `path` in the container; `host_path` only when the host's node lives
    elsewhere (a driver container's /dev), because that field needs CDI 0.5.0."""

    path: str
    host_path: str = ""

    @classmethod
    def under(cls, dev_root: Path, path: str) -> "DeviceNode":
        """The node `path` (e.g. /dev/nvidiactl) as it exists below `dev_root` on the host."""
        host = dev_root.joinpath(PurePosixPath(path).relative_to("/"))
        return cls(path=path, host_path="" if str(host) == path else str(host))

    def to_json(self) -> dict[str, Any]:
        rendered = {"path": self.path}
        if self.host_path:
            rendered["hostPath"] = self.host_path
        return rendered


class Mount(msgspec.Struct, frozen=True):
    """A mount of `host_path` at `container_path`. The mount `type` field is left out on purpose:
    it needs CDI 0.4.0, and runc already makes a bind mount of anything whose options say "bind"."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        rendered: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            rendered["options"] = list(self.options)
        return rendered


class Hook(msgspec.Struct, frozen=True):
    """An OCI hook; like execv, `args` starts with the program's own name."""

    hook_name: HookName
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        rendered: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            rendered["args"] = list(self.args)
        if self.env:
            rendered["env"] = list(self.env)
        return rendered


class ContainerEdits(msgspec.Struct, frozen=True):
    """What a runtime changes in a container for one CDI device.

    A device node given as a plain string is at the same path on the host and in the container.
    """

    env: tuple[str, ...] = ()
    device_nodes: tuple[str | DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def nodes(self) -> tuple[DeviceNode, ...]:
        return tuple(DeviceNode(node) if isinstance(node, str) else node for node in self.device_nodes)

    def plus(self, other: "ContainerEdits") -> "ContainerEdits":
        """Both edits, for a device that needs what two parts of the driver give it."""
        return ContainerEdits(
            env=(*self.env, *other.env),
            device_nodes=(*self.device_nodes, *other.device_nodes),
            mounts=(*self.mounts, *other.mounts),
            hooks=(*self.hooks, *other.hooks),
        )

    def to_json(self) -> dict[str, Any]:
        rendered: dict[str, Any] = {}
        if self.env:
            rendered["env"] = list(self.env)
        if self.device_nodes:
            rendered["deviceNodes"] = [node.to_json() for node in self.nodes()]
        if self.mounts:
            rendered["mounts"] = [mount.to_json() for mount in self.mounts]
        if self.hooks:
            rendered["hooks"] = [hook.to_json() for hook in self.hooks]
        return rendered


class CdiDevice(msgspec.Struct, frozen=True):
    name: str
    edits: ContainerEdits


class CdiSpec(msgspec.Struct, frozen=True):
    kind: str
    devices: tuple[CdiDevice, ...]

    def qualified_name(self, device: CdiDevice) -> str:
        return f"{self.kind}={device.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "cdiVersion": minimum_cdi_version(self),
            "kind": self.kind,
            "devices": [{"name": d.name, "containerEdits": d.edits.to_json()} for d in self.devices],
        }


def minimum_cdi_version(spec: CdiSpec) -> str:
    """The oldest CDI version that allows everything in `spec` (0.3.0 is the oldest still accepted).

    Mounts, hooks and device nodes without a host path are 0.3.0. A device name starting with
    something other than a letter (a claim UID does) or a device node's `hostPath` arrived in
    0.5.0; a dot in the class in 0.6.0. Nothing else this module can express needs more.
    """
    if "." in spec.kind.partition("/")[2]:
        return "0.6.0"
    if any(not _STARTS_WITH_LETTER.match(device.name) for device in spec.devices):
        return "0.5.0"
    if any(node.host_path for device in spec.devices for node in device.edits.nodes()):
        return "0.5.0"
    return "0.3.0"


def _checked_kind(kind: str) -> str:
    vendor, _, cdi_class = kind.partition("/")
    for label, value in (("vendor", vendor), ("class", cdi_class)):
        if not _VENDOR_OR_CLASS.fullmatch(value):
            raise InvalidCdiName(f"CDI {label} {value!r} breaks the CDI naming rules")
    return kind


def _checked_device(name: str, edits: ContainerEdits) -> CdiDevice:
    if not _DEVICE_NAME.fullmatch(name):
        raise InvalidCdiName(f"CDI device name {name!r} breaks the CDI naming rules")
    return CdiDevice(name=name, edits=edits)


def claim_kind(driver_name: str) -> str:
    return f"k8s.{driver_name}/{CLAIM_CLASS}"


def claim_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def claim_spec_prefix(driver_name: str) -> str:
    return f"k8s.{driver_name}-{CLAIM_CLASS}_"


def claim_spec_file_name(driver_name: str, claim_uid: str) -> str:
    return f"{claim_spec_prefix(driver_name)}{claim_uid}{SPEC_SUFFIX}"


def claim_spec(driver_name: str, claim_uid: str, devices: list[tuple[str, ContainerEdits]]) -> CdiSpec:
    """The spec of one claim, one CDI device per entry of `devices` and in the same order, its
    names checked against the CDI rules before anything is written."""
    return CdiSpec(
        kind=_checked_kind(claim_kind(driver_name)),
        devices=tuple(
            _checked_device(claim_device_name(claim_uid, device_name), edits)
            for device_name, edits in devices
        ),
    )


def node_kind(driver_name: str) -> str:
    return f"k8s.{driver_name}/{NODE_CLASS}"


def node_spec_file_name(driver_name: str) -> str:
    """Checked like a claim spec's names, since the driver name becomes part of a path."""
    _checked_kind(node_kind(driver_name))
    return f"k8s.{driver_name}-{NODE_CLASS}{SPEC_SUFFIX}"


def node_spec(driver_name: str, common: ContainerEdits) -> CdiSpec:
    """The node-wide spec: one device, `common`, with the edits every GPU container needs."""
    return CdiSpec(
        kind=_checked_kind(node_kind(driver_name)), devices=(_checked_device(COMMON_DEVICE, common),)
    )


def common_device_id(driver_name: str) -> str:
    """The CDI ID prepare returns next to a claim's own devices: k8s.<driver>/node=common."""
    return f"{_checked_kind(node_kind(driver_name))}={COMMON_DEVICE}"
