"""Strict validation of KEP-5304 device metadata files.

Upstream publishes the DeviceMetadata API as Go types with declarative validation
(k8s.io/dynamic-resource-allocation/api/metadata/{v1alpha1,v1beta1}: types.go,
zz_generated.validations.go), not as a JSON schema. This is that API written as one: the nested
Kubernetes types (ObjectMeta, resource.k8s.io/v1 DeviceAttribute and NetworkDeviceData) are taken
from the upstream OpenAPI schemas that kubernetes-validate ships, strict (unknown fields refused),
and the rules of the metadata types themselves (required fields, 32 attributes at most, DNS-label
names, driver names of at most 63 characters) are written here from the generated validations.
"""

import json
from functools import cache
from typing import Any

import jsonschema
from kubernetes_validate import utils
from referencing import Registry, Resource

from tests.support.k8s_schemas import KUBERNETES_VERSIONS

API_VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
_DEFINITIONS = "https://kubernetes.io/api/_definitions.json#/$defs/"
_DNS_LABEL = {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
# validate.LongNameCaseless with MaxLength 63: a DNS subdomain, any case.
_DRIVER = {
    "type": "string",
    "maxLength": 63,
    "pattern": "^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$",
}
# validate.ResourcePoolName: DNS subdomains joined by "/".
_POOL = {
    "type": "string",
    "maxLength": 253,
    "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[a-z0-9]([-a-z0-9.]*[a-z0-9])?)*$",
}
_ATTRIBUTE_NAME = "^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-_A-Za-z0-9]*[A-Za-z0-9])?$"


def _schema(api_version: str) -> dict[str, Any]:
    attribute = {
        "allOf": [
            {"$ref": f"{_DEFINITIONS}io.k8s.api.resource.v1.DeviceAttribute"},
            # "DeviceAttribute must have exactly one field set."
            {"minProperties": 1, "maxProperties": 1},
        ]
    }
    device = {
        "type": "object",
        "additionalProperties": False,
        "required": ["driver", "pool", "name"],
        "properties": {
            "driver": _DRIVER,
            "pool": _POOL,
            "name": _DNS_LABEL,
            "attributes": {
                "type": "object",
                "maxProperties": 32,
                "propertyNames": {"pattern": _ATTRIBUTE_NAME, "maxLength": 128},
                "additionalProperties": attribute,
            },
            "networkData": {"$ref": f"{_DEFINITIONS}io.k8s.api.resource.v1.NetworkDeviceData"},
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["kind", "apiVersion"],
        "properties": {
            "kind": {"const": "DeviceMetadata"},
            "apiVersion": {"const": api_version},
            "metadata": {"$ref": f"{_DEFINITIONS}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
            "podClaimName": _DNS_LABEL,
            "requests": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "devices": {"type": "array", "items": device},
                    },
                },
            },
        },
    }


@cache
def _registry() -> Registry:
    newest = KUBERNETES_VERSIONS[-1]
    definitions = utils.schema_contents(
        f"kubernetes-json-schema/v{newest}-local-strict/_definitions.json", newest
    )
    return Resource.from_contents(definitions) @ Registry()


def validate_metadata(document: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError where `document` breaks its API version's rules."""
    api_version = document.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise jsonschema.ValidationError(f"apiVersion {api_version!r} is not one of {API_VERSIONS}")
    jsonschema.Draft202012Validator(_schema(api_version), registry=_registry()).validate(document)


def metadata_stream(content: bytes) -> list[dict[str, Any]]:
    """The objects of a metadata file, in order, as a reader walks the stream."""
    decoder = json.JSONDecoder()
    text = content.decode()
    objects: list[dict[str, Any]] = []
    position = 0
    end = len(text.rstrip())
    while position < end:
        while text[position].isspace():
            position += 1
        value, position = decoder.raw_decode(text, position)
        objects.append(value)
    return objects
