#!/usr/bin/env python3
"""Builds dra_driver/hardware/catalog/gpus.yaml from the hand-researched GPU catalog.

The research catalog (gpu-catalog.yaml with its notes) keeps provenance, PCI ids, driver variants
and alternatives that the driver has no use for; the packaged file keeps only what the simulated
backend presents, in the units and names NVML uses. The research data does not ship with the
project, so the generated file is committed and this script records how it was made.

Usage: hack/build-catalog.py PATH/TO/gpu-catalog.yaml [--output PATH]
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "dra_driver" / "hardware" / "catalog" / "gpus.yaml"

# Models left out, with why: the simulated backend cannot present a GPU without its memory total.
EXCLUDED_MODELS = {
    "RTX-PRO-6000-Blackwell-Server-96GB": "its memory total and 4g profile ids are null",
}

PROFILE_FIELDS = (
    ("id", "profileId"),
    ("nvmlEnum", "nvmlProfileEnum"),
    ("name", "name"),
    ("computeSlices", "sliceCount"),
    ("memoryMiB", "memorySizeMiB"),
    ("multiprocessors", "multiprocessorCount"),
    ("copyEngines", "copyEngines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpegEngines"),
    ("ofaEngines", "ofaEngines"),
    ("maxInstances", "maxInstances"),
)


class CatalogError(Exception):
    pass


def required(entry: dict[str, Any], field: str, where: str) -> Any:
    """The research catalog marks unknown values as null; those must never reach the package."""
    value = entry.get(field)
    if value is None:
        raise CatalogError(f"{where}: field {field!r} is missing or null")
    return value


def convert_profile(raw: dict[str, Any], where: str) -> dict[str, Any]:
    where = f"{where} profile {raw.get('name')!r}"
    profile = {ours: required(raw, theirs, where) for ours, theirs in PROFILE_FIELDS}
    placements = required(raw, "placements", where)
    profile["placements"] = [[p["start"], p["size"]] for p in placements]
    return profile


def convert_model(raw: dict[str, Any], nvml: dict[str, Any], mig_capable: bool) -> tuple[str, dict[str, Any]]:
    key: str = raw["key"]
    where = f"model {key}"
    model: dict[str, Any] = {
        "productName": required(raw, "productName", where),
        # go-nvlib's strings (what NVML-based drivers publish), looked up in the catalog's own tables.
        "brand": nvml["brand"][required(raw, "brand", where)]["string"],
        "architecture": nvml["deviceArchitecture"][required(raw, "architecture", where)]["string"],
        "cudaComputeCapability": required(raw, "cudaComputeCapability", where),
        "memoryMiB": required(raw, "memoryTotalMiB", where),
        "multiprocessors": required(raw, "multiprocessorCount", where),
    }
    if mig_capable:
        model["mig"] = {
            "memorySlices": required(raw, "memorySlices", where),
            "maxGpuInstances": required(raw, "maxGpuInstances", where),
            "profiles": [convert_profile(p, where) for p in required(raw, "migProfiles", where)],
        }
    return key, model


def convert_catalog(source: dict[str, Any]) -> dict[str, dict[str, Any]]:
    nvml = source["nvml"]
    entries = [(raw, True) for raw in source["migGpus"]] + [(raw, False) for raw in source["nonMigGpus"]]
    models = dict(
        convert_model(raw, nvml, mig_capable)
        for raw, mig_capable in entries
        if raw["key"] not in EXCLUDED_MODELS
    )
    if missing := set(EXCLUDED_MODELS) - {raw["key"] for raw, _ in entries}:
        raise CatalogError(
            f"excluded model(s) {sorted(missing)} are not in the source; update EXCLUDED_MODELS"
        )
    return models


def not_observed(source: dict[str, Any]) -> list[str]:
    """Profiles the research marked derived or estimated, so readers of the package know which
    numbers no real GPU has confirmed."""
    return [
        f"{raw['key']} {profile['name']} ({profile['provenance']})"
        for raw in source["migGpus"]
        if raw["key"] not in EXCLUDED_MODELS
        for profile in raw["migProfiles"]
        if profile.get("provenance") != "observed"
    ]


def scalar(value: Any) -> str:
    """JSON scalars are valid YAML flow scalars, and quoting every string keeps names like
    "1g.10gb+me" or "9.0" from being read back as anything but strings."""
    return json.dumps(value)


def flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flow(item) for item in value) + "]"
    return scalar(value)


def render(models: dict[str, dict[str, Any]], header: list[str]) -> str:
    """Block style per model, one flow line per profile: diffs then show which profile changed."""
    lines = [f"# {line}".rstrip() for line in header]
    for key, model in models.items():
        lines.append("")
        lines.append(f"{key}:")
        for field, value in model.items():
            if field != "mig":
                lines.append(f"  {field}: {scalar(value)}")
        if mig := model.get("mig"):
            lines.append("  mig:")
            lines.append(f"    memorySlices: {mig['memorySlices']}")
            lines.append(f"    maxGpuInstances: {mig['maxGpuInstances']}")
            lines.append("    profiles:")
            lines.extend(f"      - {flow(profile)}" for profile in mig["profiles"])
    return "\n".join(lines) + "\n"


def header_lines(source_name: str, source: dict[str, Any]) -> list[str]:
    lines = [
        f"Generated by hack/build-catalog.py from {source_name}; do not edit by hand.",
        "",
        "GPU models the simulated backend presents. The facts were collected by hand from public",
        "sources (real nvidia-smi / NVML output, NVIDIA's MIG user guide, NVIDIA/mig-parted and",
        "NVIDIA/k8s-test-infra hardware captures); the research notes name the source of every model.",
        "",
        "Units and names: memory in MiB as NVML reports it (memoryMiB * 2^20 bytes). A profile's `id` is",
        "the nvmlGpuInstanceProfileInfo_t.id that `nvidia-smi mig -lgip` prints and -cgi takes;",
        "`nvmlEnum` is the NVML_GPU_INSTANCE_PROFILE_* constant it is queried with (two different numbers).",
        "Placements are [start, size] in memory slices. brand/architecture are go-nvlib's strings.",
        "Left out: " + "; ".join(f"{key} ({why})" for key, why in EXCLUDED_MODELS.items()) + ".",
        "",
        "Profiles not confirmed on real hardware (derived or estimated numbers):",
    ]
    return lines + [f"  {entry}" for entry in not_observed(source)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path, help="the research catalog, gpu-catalog.yaml")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"default: {DEFAULT_OUTPUT}")
    args = parser.parse_args(argv)
    source = yaml.safe_load(args.source.read_text(encoding="utf-8"))
    try:
        models = convert_catalog(source)
    except CatalogError as error:
        print(f"build-catalog: {args.source}: {error}", file=sys.stderr)
        return 1
    text = render(models, header_lines(args.source.name, source))
    # The hand-written emitter must say exactly what was converted; YAML reads it back to prove it.
    if yaml.safe_load(text) != models:
        print("build-catalog: the rendered YAML does not read back as the converted catalog", file=sys.stderr)
        return 1
    args.output.write_text(text, encoding="utf-8")
    print(f"build-catalog: wrote {len(models)} models to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
