"""The published attribute names are one vocabulary (`devices/attributes.py`): what the device
model publishes on every simulated node, offered every way, is exactly `PUBLISHED`. A new
attribute written as a bare string, or a constant nothing publishes any more, fails here."""

from dra_driver.devices.attributes import PUBLISHED
from tests.support.nodes import all_profiles, inventory_for, mode_configs, simulated_node


def published_names() -> set[str]:
    return {
        name
        for profile in all_profiles()
        for config in mode_configs(simulated_node(profile))
        for device in inventory_for(profile, config).devices
        for name in device.attributes
    }


def test_the_device_model_publishes_exactly_the_vocabulary() -> None:
    published = published_names()

    assert sorted(published - PUBLISHED) == [], "published, but not in devices/attributes.py"
    assert sorted(PUBLISHED - published) == [], "in devices/attributes.py, but never published"
