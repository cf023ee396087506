"""The published attribute names are one vocabulary (`devices/attributes.py`, and each mode's
own): what the device model publishes on every simulated node, offered every way, is exactly
`published_attributes()`. A new attribute written as a bare string, or a constant nothing
publishes any more, fails here."""

from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.modes.registry import published_attributes
from dra_driver.devices.node_config import NodeConfig
from dra_driver.hardware.model import Gpu, MigMode
from tests.support.nodes import all_profiles, inventory_for, mode_configs, simulated_node

# Mode vfio on every GPU it applies to (not among mode_configs: it offers no container devices).
VFIO = NodeConfig(default=GpuSettings(mode="vfio"))


def published_names() -> set[str]:
    offered = [
        *(
            inventory_for(profile, config)
            for profile in all_profiles()
            for config in mode_configs(simulated_node(profile))
        ),
        *(
            node_inventory(gpus, VFIO)
            for profile in all_profiles()
            if not _in_mig_mode(gpus := simulated_node(profile))
        ),
    ]
    return {name for inventory in offered for device in inventory.devices for name in device.attributes}


def _in_mig_mode(gpus: tuple[Gpu, ...]) -> bool:
    return any(gpu.mig_mode is MigMode.ENABLED for gpu in gpus)


def test_the_device_model_publishes_exactly_the_vocabulary() -> None:
    published = published_names()
    vocabulary = published_attributes()

    assert sorted(published - vocabulary) == [], "published, but in neither attributes.py nor a mode"
    assert sorted(vocabulary - published) == [], "in the vocabulary, but never published"
