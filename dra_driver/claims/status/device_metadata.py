"""Device metadata files in containers (KEP-5304): what a prepared claim's containers may read
about their own devices, without access to the API server.

Facts this module follows, and where they come from (read July 2026):
- kubernetes/enhancements keps/sig-node/5304-dra-attributes-downward-api (README.md, kep.yaml):
  alpha in 1.36, beta in 1.37, GA planned for 1.38; no Kubernetes feature gate and no API change:
  it is a protocol between a driver and the workloads, done with CDI bind mounts. The file is
  written at NodePrepareResources ("immediate metadata", as for GPUs), removed at
  NodeUnprepareResources, and stays unchanged while the claim is prepared (generation 1).
- kubernetes/dynamic-resource-allocation api/metadata (types.go, helpers.go, doc.go; the same
  code is staging/src/k8s.io/dynamic-resource-allocation in kubernetes/kubernetes), and the
  kubernetes/website page "Observability of Dynamic Resources" (section "Device metadata protocol"):
  - In the container the file is
    /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claimName>/<requestName>/<driverName>-metadata.json
    for a claim the pod names directly, and
    /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<podClaimName>/<requestName>/<driverName>-metadata.json
    for a claim made from a ResourceClaimTemplate, where podClaimName is the pod's
    spec.resourceClaims[].name. The resource claim controller records that name on the claims it
    generates in the annotation resource.kubernetes.io/pod-claim-name; upstream's writer picks the
    layout by that annotation alone, and so does this module.
  - <requestName> is the main request: the "/<subrequest>" of a firstAvailable result is dropped
    from the path but kept in the file's requests[].name.
  - The file is a stream of JSON objects, the same DeviceMetadata once per API version, newest
    first; a reader uses the first one it understands (the 1.36 decoder,
    devicemetadata.DecodeMetadataFromStream in v0.36.x, skips versions it does not know).
    Group metadata.resource.k8s.io, kind DeviceMetadata; v1alpha1 shipped with 1.36, v1beta1 (same
    fields) was added for 1.37 (api/metadata/v1beta1 and testdata/HEAD/metadata.json in kubernetes
    master, a stream of v1beta1 then v1alpha1). We write both, v1beta1 first.
  - Fields: metadata {name, namespace, uid, generation} of the claim; podClaimName (only for
    template claims); requests[] {name, devices[] {driver, pool, name, attributes, networkData}}.
    attributes has the resource.k8s.io/v1 DeviceAttribute shape ({"string": ...}, {"int": ...},
    {"bool": ...}, {"version": ...}), at most 32 of them (v1beta1 declarative validation), with
    names as in a ResourceSlice (unqualified names are the driver's own).
  - The mount is read-only ("ro", "bind"); the file mode is 0644. Upstream's helper puts the
    mount in a CDI spec of its own (kind <driver>/metadata) and adds its CDI ID to the first device
    of each request in the NodePrepareResources answer.

Where this driver differs from upstream's helper, and why:
- The mount is a CDI device in the claim's own spec (one per request), so the claim still has one
  spec file, written and removed in the steps the crash-safety protocol already covers.
- On the host the files live in <state-dir>/dra-device-metadata/<claim UID>_<request>.json
  (upstream: <plugins-dir>/<driver>/dra-device-metadata/<namespace>_<name>/<request>/metadata.json).
  Keyed by UID like every other trace of a claim, so start-up recovery matches files to records,
  and a claim re-created under the same name never meets the files of its predecessor. One flat
  directory, because creating and removing a directory per claim cost about a millisecond of
  journaled metadata updates on ext4, more than the rest of the file work together. Only the
  container path is part of the protocol.
- Attributes are the device's published ones plus what only prepare knows: the UUID of a MIG
  device created at prepare (`uuid`), and for a vGPU share its limits (`memoryLimit` in bytes,
  `coresLimit` in percent) and `shareID`.
- A device's entry is encoded once for the attributes the inventory gives it, not at every
  prepare: the JSON encoding of a GPU's 14 attributes was most of what rendering a file cost
  (issue 31). Only an entry with facts of its own prepare is encoded every time.

This module is data in, data out: `metadata_files` writes and removes the files.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from dra_driver.base.compact_json import compact_json
from dra_driver.claims.claim_object import ResourceClaimView
from dra_driver.claims.edits.cdi import ContainerEdits, Mount
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.devices.model import AttributeValue, attribute_to_api

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
RESOURCE_CLAIMS_SUBDIR = "resourceclaims"
RESOURCE_CLAIM_TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"

API_GROUP = "metadata.resource.k8s.io"
KIND = "DeviceMetadata"
# Newest first: the order of the objects in every file.
API_VERSIONS = (f"{API_GROUP}/v1beta1", f"{API_GROUP}/v1alpha1")
# Written once at prepare and never updated (upstream: generation 1 for immediate metadata).
GENERATION = 1
MAX_ATTRIBUTES = 32

# The host directory below the state directory, and the CDI device of a request's file.
HOST_SUBDIR = "dra-device-metadata"
# Between claim UID and request name: neither can contain it, so a file name parses back.
HOST_SEPARATOR = "_"
HOST_SUFFIX = ".json"
CDI_DEVICE_SUFFIX = ".metadata"

READ_ONLY = ("ro", "nosuid", "nodev", "noexec", "bind")


class MetadataDevice(msgspec.Struct, frozen=True):
    """One allocated device as its request's file lists it: `attributes` as published (the
    inventory's own mapping, never changed, which is what lets its entry be encoded once) and
    `facts` only this prepare knows, which win over a published attribute of the same name."""

    # The allocation result's request, "<request>" or "<request>/<subrequest>".
    request: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue]
    facts: Mapping[str, AttributeValue] = msgspec.field(default_factory=dict)

    @property
    def main_request(self) -> str:
        return self.request.split("/", 1)[0]


class RequestMetadata(msgspec.Struct, frozen=True):
    """The file of one request: its content, and where containers of the request see it."""

    request: str
    content: bytes
    container_path: str

    @property
    def cdi_device(self) -> str:
        return cdi_device_name(self.request)


def pod_claim_name(claim: ResourceClaimView, ref: ClaimRef) -> str | None:
    """The pod's name for a claim made from a template, from the annotation the resource claim
    controller sets; None for a claim the pod names directly. It becomes a path component in every
    container, so a new prepare is refused for one the API server would not allow there."""
    if claim.pod_claim_name_problem:
        raise ClaimRejected(f"claim {ref}: {claim.pod_claim_name_problem}")
    return claim.pod_claim_name


def container_path(driver_name: str, ref: ClaimRef, pod_claim: str | None, request: str) -> str:
    # A string, not a path object: built on every prepare, where parsing one cost more than the
    # rest of the path's work (issue 31). Every part is a checked name, so nothing to normalise.
    claim_dir = (
        f"{RESOURCE_CLAIM_TEMPLATES_SUBDIR}/{pod_claim}"
        if pod_claim
        else f"{RESOURCE_CLAIMS_SUBDIR}/{ref.name}"
    )
    return f"{CONTAINER_DIR}/{claim_dir}/{request}/{driver_name}{FILE_SUFFIX}"


def host_file_prefix(claim_uid: str) -> str:
    """What the names of all of a claim's files start with."""
    return f"{claim_uid}{HOST_SEPARATOR}"


def host_path(root: str, claim_uid: str, request: str) -> str:
    """The request's file in `root` (<state-dir>/dra-device-metadata); both names are checked
    (claim_ref; ResourceClaimView.decode for request names) before they get here. A string, not
    a path object: built on every prepare and unprepare, where pathlib cost more than the file
    work it names."""
    return f"{root}/{claim_uid}{HOST_SEPARATOR}{request}{HOST_SUFFIX}"


def cdi_device_name(request: str) -> str:
    """Unique in the claim's spec: device names are DNS labels and have no dot."""
    return f"{request}{CDI_DEVICE_SUFFIX}"


def _device(driver_name: str, device: MetadataDevice) -> dict[str, Any]:
    attributes = {**device.attributes, **device.facts} if device.facts else device.attributes
    if len(attributes) > MAX_ATTRIBUTES:
        raise ValueError(
            f"device {device.name} has {len(attributes)} metadata attributes; "
            f"the DeviceMetadata API allows {MAX_ATTRIBUTES}"
        )
    return {
        "driver": driver_name,
        "pool": device.pool,
        "name": device.name,
        "attributes": {name: attribute_to_api(value) for name, value in sorted(attributes.items())},
    }


# Encoded entries of devices without facts, by driver, pool, device and the identity of the
# attributes mapping, which each entry holds so that the identity is not reused while it is
# kept. A new inventory brings new mappings: the entries of the old one are dropped together
# once there are more than a node's devices could need.
_ENTRIES: dict[tuple[str, str, str, int], tuple[Mapping[str, AttributeValue], bytes]] = {}
_MAX_ENTRIES = 4096


def _encoded_device(driver_name: str, device: MetadataDevice) -> bytes:
    if device.facts:
        return compact_json(_device(driver_name, device))
    key = (driver_name, device.pool, device.name, id(device.attributes))
    kept = _ENTRIES.get(key)
    if kept is not None and kept[0] is device.attributes:
        return kept[1]
    encoded = compact_json(_device(driver_name, device))
    if len(_ENTRIES) >= _MAX_ENTRIES:
        _ENTRIES.clear()
    _ENTRIES[key] = (device.attributes, encoded)
    return encoded


def _fields_after_the_type(
    driver_name: str, ref: ClaimRef, pod_claim: str | None, devices: Sequence[MetadataDevice]
) -> bytes:
    """A DeviceMetadata object for the devices of one main request, encoded, less its kind and
    apiVersion, in the field order upstream's encoder writes. Put together from encoded parts,
    the devices' entries among them, as compact_json would write the whole object."""
    head: dict[str, Any] = {
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid, "generation": GENERATION},
    }
    if pod_claim:
        head["podClaimName"] = pod_claim
    # One entry per full request name: all devices of a firstAvailable request share one.
    requests: dict[str, list[bytes]] = {}
    for device in devices:
        requests.setdefault(device.request, []).append(_encoded_device(driver_name, device))
    listed = b",".join(
        b'{"name":%b,"devices":[%b]}' % (compact_json(name), b",".join(entries))
        for name, entries in requests.items()
    )
    return b'%b,"requests":[%b]}' % (compact_json(head)[:-1], listed)


# Each API version's line up to its first field after apiVersion: '{"kind":...,"apiVersion":...,'.
_LINE_HEADS = tuple(
    compact_json({"kind": KIND, "apiVersion": version})[:-1] + b"," for version in API_VERSIONS
)


def _encoded(
    driver_name: str, ref: ClaimRef, pod_claim: str | None, devices: Sequence[MetadataDevice]
) -> bytes:
    """The file's bytes: the object once per API version, newest first, one per line. The
    versions differ in apiVersion alone, so the rest is rendered and encoded once and each line
    is its head followed by those bytes (rendering and encoding twice took half the time a file
    adds to a prepare, issue 31)."""
    rest = _fields_after_the_type(driver_name, ref, pod_claim, devices)
    return b"".join(head + rest[1:] + b"\n" for head in _LINE_HEADS)


def request_metadata(
    driver_name: str, ref: ClaimRef, pod_claim: str | None, devices: Sequence[MetadataDevice]
) -> tuple[RequestMetadata, ...]:
    """The claim's files, one per main request in the order the requests first appear among
    `devices`. Each is the same object once per API version (newest first), one object per line:
    compact, because the indenting JSON encoder is pure Python and took most of the time a file
    adds to a prepare, and a line per object lets a shell reader take the version it wants with
    head or grep. The bytes are the same every time for the same input."""
    by_request: dict[str, list[MetadataDevice]] = {}
    for device in devices:
        by_request.setdefault(device.main_request, []).append(device)
    return tuple(
        RequestMetadata(
            request=request,
            content=_encoded(driver_name, ref, pod_claim, listed),
            container_path=container_path(driver_name, ref, pod_claim, request),
        )
        for request, listed in by_request.items()
    )


def mount_edits(root: str, claim_uid: str, metadata: RequestMetadata) -> ContainerEdits:
    """The CDI edits that show a request's file, read-only, at its standard path."""
    return ContainerEdits(
        mounts=(
            Mount(
                host_path=host_path(root, claim_uid, metadata.request),
                container_path=metadata.container_path,
                options=READ_ONLY,
            ),
        )
    )
