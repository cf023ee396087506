"""CDI specs for prepared claims: one transient spec file per claim.

Container runtimes resolve the IDs we hand to kubelet against these files. Each spec states the
*minimum* CDI version its content needs, because a runtime rejects a spec whose version it does
not know (podman 4.3.1 stops at 0.5.0) even when nothing in it needs the newer version.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import durable_files

CLAIM_CLASS = "claim"
_SPEC_SUFFIX = ".json"

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_STARTS_WITH_LETTER = re.compile(r"[A-Za-z]")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?")


class InvalidCdiName(ValueError):
    """A name the CDI rules (and so every container runtime) would refuse."""


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        rendered: dict[str, Any] = {}
        if self.env:
            rendered["env"] = list(self.env)
        if self.device_nodes:
            rendered["deviceNodes"] = [{"path": path} for path in self.device_nodes]
        return rendered


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: str
    edits: ContainerEdits


@dataclass(frozen=True, slots=True)
class CdiSpec:
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

    Device names starting with something other than a letter (a claim UID does) arrived in 0.5.0.
    """
    if any(not _STARTS_WITH_LETTER.match(device.name) for device in spec.devices):
        return "0.5.0"
    return "0.3.0"


def claim_kind(driver_name: str) -> str:
    return f"k8s.{driver_name}/{CLAIM_CLASS}"


def claim_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def claim_spec_file_name(driver_name: str, claim_uid: str) -> str:
    return f"k8s.{driver_name}-{CLAIM_CLASS}_{claim_uid}{_SPEC_SUFFIX}"


def claim_spec(driver_name: str, claim_uid: str, devices: list[tuple[str, ContainerEdits]]) -> CdiSpec:
    """The spec of one claim, one CDI device per entry of `devices` and in the same order, its
    names checked against the CDI rules before anything is written."""
    kind = claim_kind(driver_name)
    vendor, _, cdi_class = kind.partition("/")
    for label, value in (("vendor", vendor), ("class", cdi_class)):
        if not _VENDOR_OR_CLASS.fullmatch(value):
            raise InvalidCdiName(f"CDI {label} {value!r} breaks the CDI naming rules")
    cdi_devices = []
    for device_name, edits in devices:
        name = claim_device_name(claim_uid, device_name)
        if not _DEVICE_NAME.fullmatch(name):
            raise InvalidCdiName(f"CDI device name {name!r} breaks the CDI naming rules")
        cdi_devices.append(CdiDevice(name=name, edits=edits))
    return CdiSpec(kind=kind, devices=tuple(cdi_devices))


class CdiSpecDirectory:
    """The CDI directory the container runtime reads (/var/run/cdi in clusters).

    Specs live on tmpfs there and are rebuilt after a reboot, so writes are atomic but not fsynced.
    """

    def __init__(self, directory: Path, driver_name: str) -> None:
        self.directory = directory
        self._driver_name = driver_name

    def path_for(self, claim_uid: str) -> Path:
        return self.directory / claim_spec_file_name(self._driver_name, claim_uid)

    def claim_uids(self) -> set[str]:
        """The claims that have a spec file of this driver here."""
        prefix = claim_spec_file_name(self._driver_name, "").removesuffix(_SPEC_SUFFIX)
        if not self.directory.is_dir():
            return set()
        return {
            path.name.removeprefix(prefix).removesuffix(_SPEC_SUFFIX)
            for path in self.directory.glob(f"{prefix}*{_SPEC_SUFFIX}")
        }

    def write(self, claim_uid: str, spec: CdiSpec) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(claim_uid)
        data = json.dumps(spec.to_json(), indent=2).encode() + b"\n"
        durable_files.atomic_write(path, data, durable=False)
        return path

    def remove(self, claim_uid: str) -> None:
        durable_files.remove(self.path_for(claim_uid), durable=False)
