"""Checks of a decoded node config that need no node: what `validate-config` without
`--hardware`, `manifests` and the chart can refuse before the config reaches any GPU.

Without the node, a MIG profile name is checked against every model of the catalog (a name some
model offers may be meant for a GPU of that model); on a node, `plan_node` checks it against
that node's GPUs instead, so a GPU the catalog does not know yet is not refused here.
"""

from collections.abc import Iterator

from dra_driver.base.strict_decode import shown
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.catalog import catalog_mig_profile_names


def _unknown_profiles(settings: GpuSettings, where: str) -> Iterator[str]:
    known = catalog_mig_profile_names()
    for number, name in enumerate(settings.mig_profiles):
        if name not in known:
            yield (
                f"{where}.mig.profiles[{number}]: {shown(name)} is not a MIG profile of any GPU model of "
                f"the catalog (e.g. 1g.10gb, 3g.40gb, 1g.10gb+me)"
            )


def offline_problems(config: NodeConfig) -> list[str]:
    """One line per problem, each starting with the setting's path."""
    problems = list(_unknown_profiles(config.default, "default"))
    for entry in config.gpus:
        problems.extend(_unknown_profiles(entry.settings, entry.where))
    return problems
