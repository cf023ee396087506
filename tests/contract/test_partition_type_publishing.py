"""ResourceSlice partitionTypeAttribute against the strict stand-in API server of each version:
sent only where the schema has it (1.37), kept with DRAPartitionableDevicesType on, and given up
quietly, through the dropped-field detection, where the alpha gate is off (1.37's default)."""

import asyncio
from collections.abc import Iterator

import pytest

from dra_driver.devices.attributes import PARTITION_TYPE
from tests.contract.test_slice_controller import quiet, with_product_name
from tests.support.apiserver import ApiServer
from tests.support.nodes import inventory_for
from tests.support.publishing import DRIVER, SLICES, add_node, publishing, stored_slices

PARTITIONS = inventory_for("dgx-h100", "vgpu-partitions")
GATE = "DRAPartitionableDevicesType"


@pytest.fixture
def servers() -> Iterator[list[ApiServer]]:
    started: list[ApiServer] = []
    yield started
    for server in started:
        server.stop()


def start(servers: list[ApiServer], version: str, disabled: frozenset[str] | None) -> ApiServer:
    server = ApiServer(version, disabled_features=disabled).start()
    add_node(server)
    servers.append(server)
    return server


def device_slices(server: ApiServer) -> list[dict[str, object]]:
    return [stored["spec"] for stored in stored_slices(server) if stored["spec"].get("devices")]


async def test_a_1_37_server_with_the_gate_on_keeps_it_on_every_device_slice(
    servers: list[ApiServer],
) -> None:
    server = start(servers, "1.37", frozenset())

    async with publishing(server, PARTITIONS) as published:
        await asyncio.wait_for(published.controller.status.converged.wait(), 10)
        specs = device_slices(server)
        assert specs and all(spec["partitionTypeAttribute"] == f"{DRIVER}/{PARTITION_TYPE}" for spec in specs)
        assert published.controller.status.unsupported == frozenset()
        assert await quiet(server, 0.5) == 0
    assert server.objects("events") == []


async def test_a_1_37_server_with_the_gate_off_drops_it_once_and_is_not_warned_about(
    servers: list[ApiServer],
) -> None:
    server = start(servers, "1.37", None)
    assert GATE in server.disabled_features

    async with publishing(server, PARTITIONS, sync_delay=0.05) as published:
        await asyncio.wait_for(published.controller.status.converged.wait(), 10)
        assert published.controller.status.unsupported == {GATE}
        assert not any("partitionTypeAttribute" in spec for spec in device_slices(server))
        assert (
            published.metrics.registry.get_sample_value("dra_driver_api_feature_missing", {"feature": GATE})
            == 1
        )
        assert await quiet(server, 1.0) == 0
        # Slices written from now on do not name it, even where the server would keep it now.
        server.set_disabled_features(())
        server.reset_counts()
        published.controller.set_inventory(with_product_name(PARTITIONS, 0, "renamed"))
        await asyncio.wait_for(published.controller.status.converged.wait(), 10)
        assert server.request_count("PUT", SLICES) >= 1
        assert not any("partitionTypeAttribute" in spec for spec in device_slices(server))
    assert server.objects("events") == []  # display-only: no Warning Event on the Node


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36"])
async def test_older_servers_never_get_it(servers: list[ApiServer], version: str) -> None:
    server = start(servers, version, frozenset())

    async with publishing(server, PARTITIONS) as published:
        await asyncio.wait_for(published.controller.status.converged.wait(), 10)
        assert published.controller.status.unsupported == frozenset()
        assert device_slices(server)
        assert not any("partitionTypeAttribute" in spec for spec in device_slices(server))
