"""The resource.k8s.io/v1 DeviceClasses for the driver's devices, rendered as plain dicts.

A claim asks for devices by class, so each kind of device the driver publishes gets its own
class: a workload that asks for a whole GPU must never be handed a MIG slice or a vGPU, which look
alike to the scheduler in every other respect. The classes are rendered rather than written by
hand because their selectors name the driver, and a cluster that runs the driver under another
name needs classes that name that one.

`python -m dra_driver.devices.classes` prints the classes as a YAML stream; deploy/deviceclasses.yaml
is that output for the default driver name, and a test fails when the two differ.
"""

import argparse
import sys
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.base.kubernetes_versions import (
    DEFAULT_KUBERNETES,
    SUPPORTED_RANGE,
    kubernetes_version_problem,
)
from dra_driver.devices import attributes as names
from dra_driver.devices.extended_resources import (
    FIRST_MINOR,
    GPU_RESOURCE_NAME,
    ExtendedResources,
    catalog_mig_profiles,
    mig_profile_problem,
    mig_resource_name,
    mig_suffix,
    minor_problem,
    sorted_profiles,
    vgpu_resource_name,
    vgpu_suffix,
)
from dra_driver.devices.model import DeviceType, quantity
from dra_driver.devices.modes.registry import shipped_class_types
from dra_driver.kube.k8s_names import driver_name_problem

APP_NAME = "dra-driver"

# The types whose classes are shipped: every type but those a mode withholds (modes.registry).
CONTAINER_DEVICE_TYPES: tuple[DeviceType, ...] = shipped_class_types()


def class_name(device_type: DeviceType, driver_name: str) -> str:
    """The device type under the driver's domain: driver `gpu.dra-driver.dev` has classes
    `gpu.dra-driver.dev`, `mig.dra-driver.dev` and `vgpu.dra-driver.dev` (as NVIDIA's
    `gpu.nvidia.com` has `mig.nvidia.com`), so the class for whole GPUs is named like the driver
    and two installations under different names never collide. A driver name that does not start
    with `gpu.` keeps it whole: `example.com` gives `gpu.example.com`, `mig.example.com`."""
    domain = driver_name.removeprefix("gpu.")
    return f"{device_type}.{domain}"


# Whole-GPU classes that carry a sharing config, so that a claim gets time slicing or its own MPS
# daemon by picking a class, without an opaque config of its own (what NVIDIA's users ask for
# ready classes for): class prefix -> the GpuConfig's `sharing`. A config in the claim replaces
# the class's whole, as every claim config does (claims/opaque_config.py effective_config). The
# time slice is Long, the examples' choice: fewer switches between the processes sharing a GPU.
SHARING_CLASSES: dict[str, dict[str, Any]] = {
    "gpu-time-sliced": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
    "gpu-mps": {"strategy": "MPS"},
}


def sharing_class_name(prefix: str, driver_name: str) -> str:
    """`gpu-mps` of driver `gpu.dra-driver.dev` is `gpu-mps.dra-driver.dev`, as class_name."""
    return f"{prefix}.{driver_name.removeprefix('gpu.')}"


def selector(device_type: DeviceType, driver_name: str) -> str:
    """The CEL expression that selects exactly the driver's devices of one type.

    The scheduler evaluates a class's selector against the devices of every driver in the cluster,
    so it must be false, not an error, for all of them: a runtime error aborts the allocation of the
    whole claim. `device.attributes["<driver>"]` is an empty map for a device without attributes
    in that domain, and `.type` on it is an error; CEL's `&&` is false as soon as one side is false,
    whatever the other side does, so the driver check keeps foreign devices from ever reaching it.
    The driver check is also what makes the selector exact: another driver may publish attributes
    in our domain, but only our devices have our driver name.

    The type comes from the `type` attribute because a device's name is not visible to CEL.
    """
    domain = f'device.attributes["{driver_name}"]'
    return f'device.driver == "{driver_name}" && {domain}.{names.TYPE} == "{device_type}"'


def _device_class(
    name: str, expression: str, extended_resource_name: str | None, config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if config is not None:
        spec["config"] = config
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": APP_NAME}},
        "spec": spec,
    }


def mig_profile_selector(profile: str, driver_name: str) -> str:
    """The MIG devices of one profile, whether created at prepare (dynamic) or found (static):
    both carry the profile name as NVIDIA's tools print it."""
    return (
        f'{selector("mig", driver_name)} && device.attributes["{driver_name}"].{names.PROFILE} == "{profile}"'
    )


def vgpu_partition_selector(memory_bytes: int, driver_name: str) -> str:
    """The fixed-size vGPU partitions of one size. A partition names its GPU in `parentUUID`; the
    shareable GPU of capacity mode (also of type vgpu, with the GPU's whole memory as capacity)
    has its own `uuid` instead, so a partition size equal to some GPU's memory never selects a
    whole shared GPU. Memory is compared as a quantity, whatever its spelling."""
    domain = f'device.attributes["{driver_name}"]'
    return (
        f'{selector("vgpu", driver_name)} && "{names.PARENT_UUID}" in {domain} && '
        f'device.capacity["{driver_name}"].memory.compareTo(quantity("{quantity(memory_bytes)}")) == 0'
    )


def _extended_classes(driver_name: str, extended: ExtendedResources) -> list[dict[str, Any]]:
    """One class per MIG profile and per vGPU partition size, named like their resource under
    the driver's domain (`mig-1g.10gb.dra-driver.dev` for `nvidia.com/mig-1g.10gb`)."""
    domain = driver_name.removeprefix("gpu.")
    classes = [
        _device_class(
            f"{mig_suffix(profile)}.{domain}",
            mig_profile_selector(profile, driver_name),
            mig_resource_name(profile),
        )
        for profile in extended.mig_profiles
    ]
    classes += [
        _device_class(
            f"{vgpu_suffix(size)}.{domain}",
            vgpu_partition_selector(size, driver_name),
            vgpu_resource_name(size),
        )
        for size in extended.vgpu_partitions
    ]
    return classes


def device_classes(driver_name: str, extended: ExtendedResources | None = None) -> list[dict[str, Any]]:
    """One DeviceClass per device type, in the order gpu, mig, vgpu, then the whole-GPU classes
    with a sharing config (SHARING_CLASSES).

    With `extended` (off by default: see extended_resources.py for why it needs Kubernetes 1.36),
    the whole-GPU class also names the extended resource `nvidia.com/gpu`, and one class per MIG
    profile and per vGPU partition size follows, each naming its own resource, so pods written
    for the NVIDIA device plugin run on these devices unchanged. The type classes for all MIG
    devices and all vGPUs name none: the device plugin has no such resource.

    The driver name is checked because it is pasted into CEL string literals and object names.
    """
    if problem := driver_name_problem(driver_name):
        raise ValueError(f"driver name: {problem}")
    if extended is not None:
        for profile in extended.mig_profiles:
            if problem := mig_profile_problem(profile):
                raise ValueError(f"--extended-mig-profile: {problem}")
    classes = [
        _device_class(
            class_name(device_type, driver_name),
            selector(device_type, driver_name),
            GPU_RESOURCE_NAME if extended is not None and device_type == "gpu" else None,
        )
        for device_type in CONTAINER_DEVICE_TYPES
    ]
    classes += [
        _device_class(
            sharing_class_name(prefix, driver_name),
            selector("gpu", driver_name),
            None,
            [{"opaque": {"driver": driver_name, "parameters": _gpu_config(sharing)}}],
        )
        for prefix, sharing in SHARING_CLASSES.items()
    ]
    if extended is not None:
        classes += _extended_classes(driver_name, extended)
    return classes


def _gpu_config(sharing: dict[str, Any]) -> dict[str, Any]:
    # The API version is written out: devices/ sits below claims/, where the config is decoded
    # (tests/api/test_device_classes.py decodes these).
    return {"apiVersion": "resource.dra-driver.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing}


def device_classes_yaml(driver_name: str, extended: ExtendedResources | None = None) -> str:
    """The classes as a YAML stream, headed by the command that reproduces it. The module's
    command has no vGPU partitions (they come from node configs, through `dra-driver manifests`),
    so the header names none."""
    command = "python -m dra_driver.devices.classes"
    if driver_name != DEFAULT_DRIVER_NAME:
        command += f" --driver-name {driver_name}"
    if extended is not None:
        command += f" --extended-resources --kubernetes-version 1.{FIRST_MINOR}"
        if extended.mig_profiles != catalog_mig_profiles():
            command += "".join(f" --extended-mig-profile {profile}" for profile in extended.mig_profiles)
    header = (
        "# DeviceClasses for the devices of the DRA driver "
        f"{driver_name}.\n"
        f"# Generated by dra_driver.devices.classes; do not edit. Regenerate with:\n#   {command}\n"
        "# tests/api/test_device_classes.py keeps deploy/deviceclasses.yaml equal to the default rendering.\n"
    )
    # A wide line keeps each selector on one line, where it reads as the CEL it is.
    body = yaml.safe_dump_all(
        device_classes(driver_name, extended), sort_keys=False, explicit_start=True, width=4096
    )
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dra_driver.devices.classes",
        description="Print the DeviceClasses for the driver's devices as a YAML stream.",
    )
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="default: %(default)s")
    parser.add_argument(
        "--extended-resources",
        action="store_true",
        help="also serve the NVIDIA device plugin's resource names (nvidia.com/gpu, "
        "nvidia.com/mig-<profile>) from these classes; needs --kubernetes-version 1.36 or later",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=DEFAULT_KUBERNETES,
        metavar="1.N",
        help=f"the oldest Kubernetes the classes must work on ({SUPPORTED_RANGE}); default: %(default)s",
    )
    parser.add_argument(
        "--extended-mig-profile",
        action="append",
        metavar="PROFILE",
        help="with --extended-resources: a MIG profile (e.g. 1g.10gb) to serve as "
        "nvidia.com/mig-<profile>; repeat for more; default: every profile of the GPU catalog",
    )
    args = parser.parse_args(argv)
    if problem := kubernetes_version_problem(args.kubernetes_version):
        parser.error(f"--kubernetes-version: {problem}")
    if args.extended_mig_profile and not args.extended_resources:
        parser.error("--extended-mig-profile: only with --extended-resources")
    extended = None
    if args.extended_resources:
        if problem := minor_problem(args.kubernetes_version):
            parser.error(
                f"--extended-resources: {problem}; pass --kubernetes-version 1.{FIRST_MINOR} or later"
            )
        profiles = (
            sorted_profiles(tuple(args.extended_mig_profile))
            if args.extended_mig_profile
            else catalog_mig_profiles()
        )
        extended = ExtendedResources(mig_profiles=profiles)
    try:
        sys.stdout.write(device_classes_yaml(args.driver_name, extended))
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
