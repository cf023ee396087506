"""What `--extended-resources` adds to the DeviceClasses: which MIG profiles and vGPU partition
sizes get a class of their own, resolved from the options.

vGPU partition sizes are not a flag: they are the sizes the node configs (`--node-config`)
offer, so a class exists for every size some node can publish and for no other. The options were
checked (check_options) before this reads them.
"""

import yaml

from dra_driver.devices.extended_resources import ExtendedResources, catalog_mig_profiles, sorted_profiles
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.tools.manifests.options import ManifestOptions


def partition_sizes(options: ManifestOptions) -> tuple[int, ...]:
    """Every vGPU partition memory size of every node config (default and per-GPU entries),
    smallest first."""
    sizes: set[int] = set()
    for name, text in options.node_configs.items():
        config = parse_node_config(yaml.safe_load(text), f"node config {name!r}")
        for settings in (config.default, *(entry.settings for entry in config.gpus)):
            sizes.update(partition.memory_bytes for partition in settings.partitions)
    return tuple(sorted(sizes))


def mig_profiles(options: ManifestOptions) -> tuple[str, ...]:
    if options.extended_mig_profiles:
        return sorted_profiles(options.extended_mig_profiles)
    return catalog_mig_profiles()


def extended_resources(options: ManifestOptions) -> ExtendedResources | None:
    if not options.extended_resources:
        return None
    return ExtendedResources(mig_profiles=mig_profiles(options), vgpu_partitions=partition_sizes(options))
