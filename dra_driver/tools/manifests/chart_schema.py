"""The parts of the chart's values.schema.json that the decoders and the GPU catalog decide.

Helm cannot run the decoders, so the schema repeats what they accept; written by hand it drifted
(issue 33: negative partition sizes, unknown simulated models and made-up MIG profiles all
installed). These parts are therefore generated from the
declarations the decoders use themselves (modes, packing policies, enforcement, field names,
bounds) and from the catalog, and hack/gen-chart-schema.py writes them into the committed file;
tests/api/test_chart_schema.py fails when the file is stale, and feeds the same values to the
chart and to `dra-driver manifests` to show that both refuse them. What a schema cannot say
(two partition sizes of one node config that are equal, MiB multiples) the decoders still check
on the node and `manifests` offline.
"""

import copy
from collections.abc import Sequence
from typing import Any, get_args

from dra_driver.base.quantity import UP_TO_TERA
from dra_driver.devices.extended_resources import catalog_mig_profiles
from dra_driver.devices.modes.contract import DeviceMode, SettingsBlock
from dra_driver.devices.modes.registry import CONFIG_MODES, MODES, taking
from dra_driver.devices.node_config import Enforcement
from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.simulated_nodes import MAX_SIMULATED_GPUS, node_profiles
from dra_driver.tools.manifests.options import LOG_FORMATS

# Whole bytes as the node config decoder reads them: digits without a leading zero (YAML 1.1
# reads 010 as octal), optionally a fraction, and a suffix up to tebi/tera; never a sign.
_SUFFIXES = "|".join(sorted((suffix for suffix in UP_TO_TERA if suffix), key=lambda s: (-len(s), s)))
BYTES_PATTERN = rf"^(0|[1-9][0-9]*)(\.[0-9]+)?({_SUFFIXES})?$"
# A config is named by a Node label's value (and stored as the ConfigMap key <name>.yaml).
CONFIG_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_SETTINGS_FIELDS = ("mode", "vgpu", "mig", "packing")
_SELECTORS = ("index", "uuid", "model", "productName")


def _bytes(minimum_mib: int) -> dict[str, Any]:
    return {
        "oneOf": [
            {"type": "integer", "minimum": minimum_mib * 2**20},
            {"type": "string", "pattern": BYTES_PATTERN},
        ],
        "description": "whole bytes such as 10Gi, 512Mi or 1073741824 (a whole number of MiB)",
    }


def _settings_properties() -> dict[str, Any]:
    profiles = list(catalog_mig_profiles())
    return {
        "mode": {"enum": list(CONFIG_MODES)},
        "vgpu": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "memoryStep": _bytes(1),
                "partitions": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["memory"],
                        "properties": {
                            "memory": _bytes(1),
                            "cores": {"type": "integer", "minimum": 1, "maximum": 100},
                        },
                    },
                },
                "enforcement": {"enum": list(get_args(Enforcement))},
            },
        },
        "mig": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "profiles": {
                    "type": "array",
                    "items": {"enum": profiles, "description": "a MIG profile of the GPU catalog"},
                }
            },
        },
        "packing": {"enum": list(get_args(PackingPolicy))},
    }


def _settings_rules() -> list[dict[str, Any]]:
    """The decoder's rules between fields of one settings block, as if/then pairs."""

    def mode_is_not(*modes: str) -> dict[str, Any]:
        return {"not": {"required": ["mode"], "properties": {"mode": {"enum": list(modes)}}}}

    def one_of(modes: Sequence[DeviceMode]) -> dict[str, Any]:
        names = [mode.name for mode in modes]
        return {"const": names[0]} if len(names) == 1 else {"enum": names}

    def block_needs_its_modes(block: SettingsBlock) -> dict[str, Any]:
        return {
            "if": {"required": [block]},
            "then": {"required": ["mode"], "properties": {"mode": one_of(taking(block))}},
        }

    partitioned = [mode for mode in MODES if mode.partitions]
    return [
        *(block_needs_its_modes(block) for block in get_args(SettingsBlock)),
        {
            "if": {"required": ["mode"], "properties": {"mode": one_of(partitioned)}},
            "then": {"required": ["vgpu"], "properties": {"vgpu": {"required": ["partitions"]}}},
            "else": {"properties": {"vgpu": {"not": {"required": ["partitions"]}}}},
        },
        {
            "if": {"required": ["packing"], "properties": {"packing": {"const": "spread"}}},
            "then": mode_is_not(*(mode.name for mode in MODES if mode.no_spread)),
        },
    ]


def node_config_schema() -> dict[str, Any]:
    settings = _settings_properties()
    models = sorted(gpu_models())
    entry_properties: dict[str, Any] = {
        "index": {"type": "integer", "minimum": 0},
        "uuid": {"type": "string", "minLength": 1},
        "model": {"enum": models, "description": "a GPU model of the catalog"},
        "productName": {"type": "string", "pattern": r"\S"},
        **settings,
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "default": {
                "type": "object",
                "additionalProperties": False,
                "properties": dict(settings),
                "allOf": _settings_rules(),
            },
            "gpus": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": entry_properties,
                    "oneOf": [{"required": [selector]} for selector in _SELECTORS],
                    "allOf": _settings_rules(),
                },
            },
        },
    }


def simulated_node_schema() -> dict[str, Any]:
    """The simulated node decoder's fields; where MIG instances may sit is left to it."""
    return {
        "type": ["object", "null"],
        "additionalProperties": False,
        "required": ["gpus"],
        "properties": {
            "driverVersion": {"type": "string"},
            "cudaDriverVersion": {"type": "string"},
            "fabricClique": {"type": "string"},
            "gpus": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["model", "count"],
                    "properties": {
                        "model": {"enum": sorted(gpu_models()), "description": "a GPU model of the catalog"},
                        "count": {"type": "integer", "minimum": 1, "maximum": MAX_SIMULATED_GPUS},
                        "migMode": {"enum": ["enabled", "disabled"]},
                        "migInstances": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["profile", "start"],
                                "properties": {
                                    "profile": {"enum": list(catalog_mig_profiles())},
                                    "start": {"type": "integer", "minimum": 0},
                                },
                            },
                        },
                    },
                },
            },
        },
    }


def generated_parts() -> dict[str, dict[str, Any]]:
    """Each generated property of the values schema, by its top-level name (or a dotted path
    for a property nested in a hand-written one)."""
    return {
        "hardware": {
            "type": "string",
            "pattern": f"^(nvml|simulated:({'|'.join(sorted(node_profiles()))}))$",
            "description": "nvml, or simulated:<profile> (dra_driver/hardware/catalog/node-profiles.yaml)",
        },
        "simulatedNode": simulated_node_schema(),
        "logFormat": {"enum": list(LOG_FORMATS)},
        # Names by patternProperties, not propertyNames: Helm reports a propertyNames failure at
        # another value's path, an additional property at this one's, with the name.
        "nodeConfigs": {
            "type": "object",
            "description": "configs by name, a label value: the Node label dra-driver.dev/config names one",
            "patternProperties": {CONFIG_NAME_PATTERN: node_config_schema()},
            "additionalProperties": False,
        },
        "extendedResources.properties.migProfiles": {
            "type": "array",
            "uniqueItems": True,
            "items": {
                "enum": list(catalog_mig_profiles()),
                "description": "a MIG profile of the GPU catalog",
            },
        },
    }


def with_generated_parts(schema: dict[str, Any]) -> dict[str, Any]:
    """The values schema with every generated part replaced; the hand-written rest unchanged."""
    result = copy.deepcopy(schema)
    for path, part in generated_parts().items():
        top, *rest = path.split(".")
        holder = result["properties"]
        key = top
        for step in rest:
            holder = holder[key]
            key = step
        holder[key] = part
    return result
