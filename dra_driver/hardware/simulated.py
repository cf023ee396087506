"""A simulated node: GPUs from the catalog, identical across runs for the same node name.

This is what the demo, the tests and kind clusters run on. UUIDs and PCI addresses are derived
from the node name and GPU index, so restarting the agent (or running it on another machine)
yields the same devices, exactly as real hardware would.
"""

import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dra_driver.hardware.model import Gpu, HardwareError

MAX_SIMULATED_GPUS = 16
DEFAULT_DRIVER_VERSION = "580.95.05"
DEFAULT_CUDA_DRIVER_VERSION = "13.0"
_UUID_NAMESPACE = uuid.UUID("6b1f0c3e-5d4a-4c2b-9e8f-7a6d5c4b3a29")


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_mib: int
    multiprocessors: int


@dataclass(frozen=True, slots=True)
class SimulatedNodeSpec:
    origin: str
    model: GpuModel
    count: int
    driver_version: str
    cuda_driver_version: str


def _read_packaged_yaml(name: str) -> dict[str, Any]:
    text = resources.files("dra_driver.hardware.catalog").joinpath(name).read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


@cache
def gpu_models() -> dict[str, GpuModel]:
    return {
        key: GpuModel(
            key=key,
            product_name=facts["productName"],
            brand=facts["brand"],
            architecture=facts["architecture"],
            cuda_compute_capability=facts["cudaComputeCapability"],
            memory_mib=facts["memoryMiB"],
            multiprocessors=facts["multiprocessors"],
        )
        for key, facts in _read_packaged_yaml("gpus.yaml").items()
    }


@cache
def node_profiles() -> dict[str, Any]:
    return _read_packaged_yaml("node-profiles.yaml")


_NODE_SPEC_FIELDS = {"model", "count", "driverVersion", "cudaDriverVersion"}


def parse_node_spec(raw: object, origin: str) -> SimulatedNodeSpec:
    """Strictly decodes a node description; every error names the origin and the field."""

    def fail(message: str) -> HardwareError:
        return HardwareError(f"simulated node {origin}: {message}")

    if not isinstance(raw, dict):
        raise fail(f"expected a mapping with fields {sorted(_NODE_SPEC_FIELDS)}, got {type(raw).__name__}")
    if unknown := set(raw) - _NODE_SPEC_FIELDS:
        raise fail(f"unknown field(s) {sorted(map(str, unknown))}; allowed: {sorted(_NODE_SPEC_FIELDS)}")
    model_key = raw.get("model")
    models = gpu_models()
    if model_key not in models:
        raise fail(
            f"field 'model': unknown GPU model {model_key!r}; known models: {', '.join(sorted(models))}"
        )
    count = raw.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SIMULATED_GPUS:
        raise fail(f"field 'count': expected an integer from 1 to {MAX_SIMULATED_GPUS}, got {count!r}")
    versions = {}
    for field, default in (
        ("driverVersion", DEFAULT_DRIVER_VERSION),
        ("cudaDriverVersion", DEFAULT_CUDA_DRIVER_VERSION),
    ):
        value = raw.get(field, default)
        if not isinstance(value, str) or not all(part.isdigit() for part in value.split(".")):
            raise fail(f"field {field!r}: expected a dotted version string like {default!r}, got {value!r}")
        versions[field] = value
    return SimulatedNodeSpec(
        origin=origin,
        model=models[model_key],
        count=count,
        driver_version=versions["driverVersion"],
        cuda_driver_version=versions["cudaDriverVersion"],
    )


def resolve_node_spec(source: str) -> SimulatedNodeSpec:
    """`source` is a profile name, or a path (anything with '/' or a .yaml/.yml suffix)."""
    if "/" in source or source.endswith((".yaml", ".yml")):
        path = Path(source)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise HardwareError(f"simulated node file {source}: cannot read it: {error.strerror}") from error
        except yaml.YAMLError as error:
            raise HardwareError(f"simulated node file {source}: not valid YAML: {error}") from error
        return parse_node_spec(raw, f"file {source}")
    profiles = node_profiles()
    if source not in profiles:
        raise HardwareError(
            f"unknown simulated node profile {source!r}; known profiles: {', '.join(sorted(profiles))}"
        )
    return parse_node_spec(profiles[source], f"profile {source}")


def simulated_gpus(node_name: str, spec: SimulatedNodeSpec) -> tuple[Gpu, ...]:
    """The GPUs of `spec` as they would appear on node `node_name`."""
    model = spec.model
    gpus = []
    for index in range(spec.count):
        bus = 0x18 + 0x0C * index
        gpus.append(
            Gpu(
                uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}",
                index=index,
                minor=index,
                product_name=model.product_name,
                brand=model.brand,
                architecture=model.architecture,
                cuda_compute_capability=model.cuda_compute_capability,
                memory_bytes=model.memory_mib * 2**20,
                multiprocessors=model.multiprocessors,
                pci_bus_id=f"0000:{bus:02x}:00.0",
                pcie_root=f"pci0000:{0x10 * (index // 2):02x}",
                driver_version=spec.driver_version,
                cuda_driver_version=spec.cuda_driver_version,
            )
        )
    return tuple(gpus)


class SimulatedBackend:
    def __init__(self, node_name: str, spec: SimulatedNodeSpec) -> None:
        self._gpus = simulated_gpus(node_name, spec)
        self._description = f"simulated {spec.origin}: {spec.count}x {spec.model.product_name}"

    @property
    def description(self) -> str:
        return self._description

    async def discover(self) -> tuple[Gpu, ...]:
        return self._gpus

    async def close(self) -> None:
        return None
