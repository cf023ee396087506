"""The user examples in deploy/examples, the e2e node they are meant for, and what their pods print.

Shared by tests/api/test_examples.py (which checks the examples here, without a cluster) and
tests/e2e (which runs them on kind), so that both read the examples, the node and the pods'
output the same way.

Which devices a request can get is worked out the way the scheduler's allocator does for one
node: the DeviceClass's selectors and the request's, evaluated by the real CEL engine
(tests/support/cel.py), then the capacity requests (KEP-5075): on a device that allows multiple
allocations a request is rounded up by the capacity's request policy and must fit; on any other
device the device must have at least the requested capacity.
"""

import math
import re
import shlex
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.node_config_files import load_node_config
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.model import Device, device_to_api, quantity
from dra_driver.hardware.model import Gpu
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from tests.support.cel import parse_quantity, selects

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPOSITORY / "deploy" / "examples"
DEVICE_CLASSES_FILE = REPOSITORY / "deploy" / "deviceclasses.yaml"
E2E_NODE_DIR = REPOSITORY / "hack" / "e2e-node"
E2E_HARDWARE_FILE = E2E_NODE_DIR / "simulated-node.yaml"
E2E_NODE_CONFIG_FILE = E2E_NODE_DIR / "node-config.yaml"
D = DEFAULT_DRIVER_NAME

# What the example pods print: a marker line, then `env | sort`, a marker line, then `ls -1 /dev`.
ENV_MARKER = "== env"
DEV_MARKER = "== /dev"

# What the examples ask for and the e2e tests look for in the containers. tests/api/test_examples.py
# checks each against the example's YAML and against what the claim engine renders from it.
MIG_PROFILE = "1g.10gb"
VGPU_MEMORY_LIMIT = "10240m"  # CUDA_DEVICE_MEMORY_LIMIT_0 for 10Gi: MiB, as HAMi-core reads it
VGPU_SM_LIMIT = "30"  # CUDA_DEVICE_SM_LIMIT_0 for cores: "30"
# The same share under vgpu.enforcement mps (the e2e node's default): its MPS client settings.
VGPU_MPS_THREADS = "30"  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
VGPU_MPS_MEMORY = "0=10240M"  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: device 0, 10Gi in MiB
# mig-static-3g40gb.yaml: an instance that the e2e node's GPU 9 has from boot.
MIG_STATIC_PROFILE = "3g.40gb"
# vgpu-partition-6gi.yaml: the L4's 6Gi / 25 % partition, under the GPU's MPS daemon.
PARTITION_MPS_THREADS = "25"
PARTITION_MPS_MEMORY = "0=6144M"
# mps-shared.yaml: the client limits of the claim's own MPS daemon, as its GpuConfig sets them.
CLAIM_MPS_THREADS = "50"
CLAIM_MPS_MEMORY = "0=10240M"
CEL_PRODUCT_PREFIX = "NVIDIA H100"
CEL_MIN_MEMORY = "40Gi"


# --- The examples ---------------------------------------------------------------------------------


def example_paths() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def example_path(name: str) -> Path:
    return EXAMPLES_DIR / f"{name}.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [item for item in objects if item["kind"] == kind]
    return found


def pod_of(path: Path) -> dict[str, Any]:
    return only(documents(path), "Pod")


def requests_of(template: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, request) for every device request of a ResourceClaimTemplate; the subrequests of a
    firstAvailable request as `<request>/<subrequest>`, as allocation results name them."""
    for request in template["spec"]["spec"]["devices"]["requests"]:
        if "exactly" in request:
            yield request["name"], request["exactly"]
        for subrequest in request.get("firstAvailable", []):
            yield f"{request['name']}/{subrequest['name']}", subrequest


def device_classes() -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item for item in documents(DEVICE_CLASSES_FILE)}


# --- What the pods print --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    env: dict[str, str]
    dev: frozenset[str]


def parse_report(text: str) -> Report:
    """A container's log: `env | sort` between the markers, `ls -1 /dev` after the second."""
    lines = text.splitlines()
    if ENV_MARKER not in lines or DEV_MARKER not in lines:
        raise ValueError(f"no {ENV_MARKER!r} and {DEV_MARKER!r} lines in the output:\n{text}")
    start, middle = lines.index(ENV_MARKER), lines.index(DEV_MARKER)
    env = dict(line.partition("=")[::2] for line in lines[start + 1 : middle] if "=" in line)
    return Report(env=env, dev=frozenset(lines[middle + 1 :]))


def run_locally(container: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """A container's command run by this machine's shell, for checking that it prints a report."""
    argv = [*container.get("command", []), *container.get("args", [])]
    completed = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=30, check=False)
    assert completed.returncode == 0, f"{shlex.join(argv)} failed: {completed.stderr}"
    return completed.stdout


_DEVICE_ENV = re.compile(r"DRA_DEVICE_GPU_(?P<minor>[0-9]+)")


def whole_gpu_uuids(env: Mapping[str, str]) -> dict[str, str]:
    """`DRA_DEVICE_GPU_<minor>` -> GPU UUID: the whole GPUs or vGPUs a simulated node gave a container."""
    return {name: value for name, value in env.items() if _DEVICE_ENV.fullmatch(name)}


def mig_profiles(env: Mapping[str, str]) -> dict[str, str]:
    """`DRA_DEVICE_<MIG device>_PROFILE` -> profile name: the MIG devices a simulated node gave."""
    return {
        name: value
        for name, value in env.items()
        if name.startswith("DRA_DEVICE_") and "_MIG_" in name and name.endswith("_PROFILE")
    }


# --- The e2e node and matching devices ------------------------------------------------------------


@cache
def e2e_node_gpus(node_name: str) -> tuple[Gpu, ...]:
    return simulated_gpus(node_name, resolve_node_spec(str(E2E_HARDWARE_FILE)))


@cache
def e2e_node_inventory(node_name: str = "kind-worker") -> Inventory:
    """What the agent on the kind worker publishes (GPU UUIDs depend on the node's name)."""
    return node_inventory(e2e_node_gpus(node_name), load_node_config(E2E_NODE_CONFIG_FILE))


def _ceiling_to_step(requested: Fraction, minimum: Fraction, step: Fraction) -> Fraction:
    return minimum + math.ceil((requested - minimum) / step) * step


def consumed_capacity(request: Mapping[str, Any], device: Mapping[str, Any]) -> dict[str, str] | None:
    """What the request would take of `device` (a rendered resource.k8s.io/v1 Device), as the
    allocation result's `consumedCapacity` says it; None when it does not fit. Empty for a
    device that does not allow multiple allocations, where capacity requests only filter."""
    requested = {
        name: parse_quantity(str(value))
        for name, value in request.get("capacity", {}).get("requests", {}).items()
    }
    capacity = device.get("capacity", {})
    if any(name not in capacity for name in requested):
        return None
    if not device.get("allowMultipleAllocations", False):
        fits = all(requested[name] <= parse_quantity(capacity[name]["value"]) for name in requested)
        return {} if fits else None
    consumed: dict[str, str] = {}
    for name, entry in capacity.items():
        value = parse_quantity(entry["value"])
        policy = entry.get("requestPolicy")
        if policy is None:
            amount = value  # consumed whole
        elif name not in requested:
            amount = parse_quantity(policy["default"])
        elif "validValues" in policy:
            allowed = [
                parse_quantity(item)
                for item in policy["validValues"]
                if parse_quantity(item) >= requested[name]
            ]
            if not allowed:
                return None
            amount = min(allowed)
        else:
            valid = policy["validRange"]
            minimum = parse_quantity(valid["min"])
            amount = max(requested[name], minimum)
            if "step" in valid:
                amount = _ceiling_to_step(amount, minimum, parse_quantity(valid["step"]))
            if "max" in valid and amount > parse_quantity(valid["max"]):
                return None
        if amount > value:
            return None
        assert amount.denominator == 1, f"{name}: {amount} is not a whole quantity"
        consumed[name] = quantity(amount.numerator)
    return consumed


def candidates(request: Mapping[str, Any], devices: tuple[Device, ...]) -> list[Device]:
    """The devices one request (or subrequest) could be allocated, of one node's devices."""
    device_class = device_classes()[request["deviceClassName"]]
    expressions = [selector["cel"]["expression"] for selector in device_class["spec"]["selectors"]]
    expressions += [selector["cel"]["expression"] for selector in request.get("selectors", [])]
    chosen = []
    for device in devices:
        rendered = device_to_api(device)
        # Like the allocator: the next selector is evaluated only while the earlier ones hold.
        if all(selects(expression, D, rendered) for expression in expressions) and (
            consumed_capacity(request, rendered) is not None
        ):
            chosen.append(device)
    return chosen
