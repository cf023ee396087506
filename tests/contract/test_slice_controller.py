"""The ResourceSlice controller against the strict stand-in API server, through the official
asyncio client: convergence, exact write counts, quiet periods, faults, versions, dropped fields."""

import asyncio
import copy
import urllib.error
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.slices import SliceLayout, plan_slices
from tests.support.apiserver import ApiServer
from tests.support.nodes import inventory_for
from tests.support.publishing import (
    SLICES,
    add_node,
    falling_back,
    foreign_delete,
    foreign_replace,
    pool_problems,
    publishing,
    stored_slices,
)
from tests.support.waiting import until

MIG_NODE = inventory_for("dgx-h100-mig", "mig-dynamic")


@pytest.fixture
def server() -> Iterator[ApiServer]:
    started = ApiServer().start()
    add_node(started)
    yield started
    started.stop()


def slice_count(inventory: Inventory, layout: SliceLayout = "1.35") -> int:
    return len(plan_slices(inventory, layout))


def with_product_name(inventory: Inventory, device_index: int, name: str) -> Inventory:
    device = inventory.devices[device_index]
    changed = replace(device, attributes={**device.attributes, "productName": name})
    devices = tuple(changed if d is device else d for d in inventory.devices)
    return replace(inventory, devices=devices, device_by_name={d.name: d for d in devices})


async def quiet(server: ApiServer, seconds: float) -> int:
    """Writes the server receives while nothing changes. Starts counting a moment after the
    pool looked right, so the answer to the last write of the sync is not counted as quiet."""
    await asyncio.sleep(0.2)
    server.reset_counts()
    await asyncio.sleep(seconds)
    return server.writes(SLICES)


async def test_from_empty_each_slice_is_written_once_and_owned_by_the_node(server: ApiServer) -> None:
    async with publishing(server, MIG_NODE) as published:
        await published.converged(server, MIG_NODE)
        assert server.writes(SLICES) == slice_count(MIG_NODE) == 5
        assert server.request_count("POST", SLICES) == 5
        assert await quiet(server, 1.0) == 0

    (node,) = server.objects("nodes")
    for stored in stored_slices(server):
        assert stored["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": "node-a",
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        ]
        assert stored["spec"]["pool"]["generation"] == 1


async def test_a_long_quiet_period_with_dropped_and_expired_watches_writes_nothing(server: ApiServer) -> None:
    async with publishing(server, MIG_NODE, sync_delay=0.05) as published:
        await published.converged(server, MIG_NODE)
        server.reset_counts()
        for disturb in (server.drop_watches, server.expire_watches, server.compact, server.drop_watches):
            await asyncio.sleep(0.5)
            disturb()
        await asyncio.sleep(1.0)
        assert server.writes(SLICES) == 0
        assert server.request_count("GET", SLICES) >= 1, "the expired watch was followed by a fresh list"


async def test_an_external_delete_is_repaired_within_the_sync_delay(server: ApiServer) -> None:
    async with publishing(server, MIG_NODE, sync_delay=0.3) as published:
        await published.converged(server, MIG_NODE)
        server.reset_counts()
        victim = stored_slices(server)[2]["metadata"]["name"]
        foreign_delete(server, victim)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await published.converged(server, MIG_NODE, within=5)
        took = loop.time() - started
        assert 0.25 <= took < 3.0, took
        # A new slice means a new generation: one create and every other slice rewritten.
        assert server.request_count("POST", SLICES) == 1
        assert server.request_count("PUT", SLICES) == 4
        assert {s["spec"]["pool"]["generation"] for s in stored_slices(server)} == {2}


async def test_an_external_edit_of_one_slice_is_one_update(server: ApiServer) -> None:
    async with publishing(server, MIG_NODE, sync_delay=0.1) as published:
        await published.converged(server, MIG_NODE)
        edited = stored_slices(server)[1]
        edited["spec"]["devices"] = edited["spec"]["devices"][:3]
        foreign_replace(server, edited)
        server.reset_counts()
        await asyncio.sleep(0.05)
        await published.converged(server, MIG_NODE)
        assert (server.writes(SLICES), server.request_count("PUT", SLICES)) == (1, 1)
        assert await quiet(server, 0.5) == 0


async def test_stale_slices_of_an_earlier_plan_are_taken_over(server: ApiServer) -> None:
    old = inventory_for("dgx-h100", "default")

    async def first_run() -> None:
        async with publishing(server, old) as published:
            await published.converged(server, old)

    async def second_run() -> None:
        server.reset_counts()
        async with publishing(server, MIG_NODE) as published:
            await published.converged(server, MIG_NODE)
            # The old single slice is index 0: updated in place; four more created; one new generation.
            assert (server.request_count("PUT", SLICES), server.request_count("POST", SLICES)) == (1, 4)
            assert server.request_count("DELETE", SLICES) == 0
            assert {s["spec"]["pool"]["generation"] for s in stored_slices(server)} == {2}

    await first_run()
    await second_run()


async def test_a_restarted_controller_writes_nothing_when_the_slices_are_right(server: ApiServer) -> None:
    async def once() -> None:
        async with publishing(server, MIG_NODE) as published:
            await published.converged(server, MIG_NODE)
            await asyncio.sleep(0.2)

    await once()
    server.reset_counts()
    await once()
    assert server.writes(SLICES) == 0


async def test_a_one_device_change_is_one_write_and_two_slices_bump_the_generation(server: ApiServer) -> None:
    async with publishing(server, MIG_NODE) as published:
        await published.converged(server, MIG_NODE)
        server.reset_counts()
        one = with_product_name(MIG_NODE, 5, "renamed")
        published.controller.set_inventory(one)
        await published.converged(server, one)
        assert server.writes(SLICES) == 1
        assert {s["spec"]["pool"]["generation"] for s in stored_slices(server)} == {1}

        server.reset_counts()
        two = with_product_name(with_product_name(one, 0, "a"), len(one.devices) - 1, "b")
        published.controller.set_inventory(two)
        await published.converged(server, two)
        assert server.writes(SLICES) == slice_count(two)
        assert {s["spec"]["pool"]["generation"] for s in stored_slices(server)} == {2}


async def test_fewer_slices_delete_the_extra_ones(server: ApiServer) -> None:
    small = inventory_for("dgx-h100", "default")

    async with publishing(server, MIG_NODE) as published:
        await published.converged(server, MIG_NODE)
        server.reset_counts()
        published.controller.set_inventory(small)
        await published.converged(server, small)
        assert server.request_count("DELETE", SLICES) == 4
        assert server.request_count("PUT", SLICES) == 1


@pytest.mark.parametrize(("version", "layout"), [("1.34", "1.34"), ("1.35", "1.35"), ("1.37", "1.35")])
async def test_the_slice_layout_follows_the_server_version(version: str, layout: SliceLayout) -> None:
    server = ApiServer(version=version, disabled_features=frozenset()).start()
    add_node(server)

    try:
        async with publishing(server, MIG_NODE) as published:
            await published.converged(server, MIG_NODE)
            assert published.controller.status.layout == layout
            with_counters = [s for s in stored_slices(server) if s["spec"].get("sharedCounters")]
            mixes = {bool(s["spec"].get("devices")) for s in with_counters}
            assert mixes == ({True} if layout == "1.34" else {False})
        assert server.writes(SLICES) == slice_count(MIG_NODE, layout)
    finally:
        server.stop()


async def test_a_server_that_drops_consumable_capacity_gets_vgpu_partitions_once(server: ApiServer) -> None:
    capacity = inventory_for("dgx-h100", "vgpu-capacity")
    server.set_disabled_features(frozenset({"DRAConsumableCapacity"}))

    async with publishing(server, capacity, sync_delay=0.05) as published:
        fallen = falling_back(capacity)(frozenset({"DRAConsumableCapacity"}))
        assert fallen is not None
        await published.converged(server, fallen)
        assert published.controller.status.unsupported == {"DRAConsumableCapacity"}
        assert any(d.name.startswith("gpu-0-vgpu-") for d in fallen.devices)
        assert (
            published.metrics.registry.get_sample_value(
                "dra_driver_api_feature_missing", {"feature": "DRAConsumableCapacity"}
            )
            == 1
        )
        assert await quiet(server, 1.0) == 0

    events = server.objects("events")
    assert len(events) == 1
    (event,) = events
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == "node-a"
    assert event["type"] == "Warning" and "DRAConsumableCapacity" in event["message"]


async def test_fields_no_gate_explains_are_adopted_instead_of_rewritten_forever(server: ApiServer) -> None:
    capacity = inventory_for("t4x4", "vgpu-capacity")
    server.set_disabled_features(frozenset({"DRAConsumableCapacity"}))

    async with publishing(server, capacity, sync_delay=0.05, with_fall_back=False) as published:
        await asyncio.wait_for(published.controller.status.converged.wait(), 10)
        assert await quiet(server, 1.0) == 0
        assert len(stored_slices(server)) == 1
        assert len(server.objects("events")) == 1


async def test_dry_run_reports_the_writes_and_makes_none(server: ApiServer) -> None:
    async with publishing(server, MIG_NODE, dry_run=True) as published:
        await asyncio.wait_for(published.controller.status.converged.wait(), 10)
        await asyncio.sleep(0.3)
        (writes,) = published.dry_runs
        assert [type(w).__name__ for w in writes] == ["Create"] * 5
        assert server.writes(SLICES) == 0


async def test_server_errors_are_retried_without_duplicates(server: ApiServer) -> None:
    server.faults.fail_methods = frozenset({"POST"})
    server.faults.fail_next = 3
    server.faults.fail_after_commit_next = 2
    async with publishing(server, MIG_NODE) as published:
        await published.converged(server, MIG_NODE)
        names = [s["metadata"]["name"][:5] for s in stored_slices(server)]
        assert names == sorted(set(names)), "one slice per index"
        registry = published.metrics.registry
        errors = [
            registry.get_sample_value(
                "dra_driver_resourceslice_api_errors_total", {"verb": verb, "status": "500"}
            )
            or 0
            for verb in ("create", "update", "delete")
        ]
        assert sum(errors) == 5, "3 refused creates, 2 writes that landed but answered 500"


# -- hypothesis: random fault schedules ------------------------------------------------------------

Fault = tuple[str, int]
FAULTS = st.tuples(
    st.sampled_from(
        (
            "fail",
            "fail_after_commit",
            "conflict",
            "drop_watches",
            "expire_watches",
            "delete",
            "edit",
            "latency",
        )
    ),
    st.integers(1, 3),
)


def foreign_write(server: ApiServer, write: Callable[[], None]) -> None:
    """Another client's write, which the faults meant for the controller must not hit. The
    controller's own requests run meanwhile in the server's thread: a slice it deleted or changed
    between our read and our write answers 404 or 409, and like any client that lost such a race
    we leave it (the fault then changes nothing)."""
    faults = server.faults
    pending = (faults.fail_next, faults.fail_after_commit_next, faults.conflict_next)
    faults.fail_next = faults.fail_after_commit_next = faults.conflict_next = 0
    try:
        write()
    except urllib.error.HTTPError as error:
        if error.code not in (404, 409):
            raise
    finally:
        faults.fail_next, faults.fail_after_commit_next, faults.conflict_next = pending


def inject(server: ApiServer, fault: Fault) -> None:
    kind, amount = fault
    stored = stored_slices(server)
    match kind:
        case "fail":
            server.faults.fail_next = amount
        case "fail_after_commit":
            server.faults.fail_after_commit_next = amount
        case "conflict":
            server.faults.conflict_next = amount
        case "drop_watches":
            server.drop_watches()
        case "expire_watches":
            server.expire_watches()
        case "delete" if stored:
            name = stored[amount % len(stored)]["metadata"]["name"]
            foreign_write(server, lambda: foreign_delete(server, name))
        case "edit" if stored:
            edited: dict[str, Any] = copy.deepcopy(stored[amount % len(stored)])
            edited["spec"]["devices"] = edited["spec"].get("devices", [])[:amount]
            foreign_write(server, lambda: foreign_replace(server, edited))
        case "latency":
            server.faults.latency_seconds = 0.02 * amount


def clear_faults(server: ApiServer) -> None:
    server.faults.fail_next = server.faults.fail_after_commit_next = server.faults.conflict_next = 0
    server.faults.latency_seconds = 0.0


# Each example runs a controller for about a second; shrinking a failure would take many minutes,
# so the failing schedule is reported as found.
@settings(max_examples=15, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(schedule=st.lists(FAULTS, min_size=1, max_size=6), start_populated=st.booleans())
async def test_no_fault_schedule_leaves_duplicates_or_a_wrong_pool(
    schedule: list[Fault], start_populated: bool
) -> None:
    server = ApiServer().start()
    add_node(server)
    inventories = [MIG_NODE, with_product_name(MIG_NODE, 1, "changed")]

    try:
        async with publishing(server, MIG_NODE, sync_delay=0.05) as published:
            if start_populated:
                await published.converged(server, MIG_NODE)
            for step, fault in enumerate(schedule):
                inject(server, fault)
                if step % 2:
                    published.controller.set_inventory(inventories[step % 4 // 2])
                await asyncio.sleep(0.05)
            clear_faults(server)
            final = published.controller.inventory
            await published.converged(server, final, within=20)
            assert await quiet(server, 0.3) == 0
        assert pool_problems(server, stored_pool_inventory(stored_slices(server))) == []
    finally:
        server.stop()


def stored_pool_inventory(stored: list[dict[str, Any]]) -> Inventory:
    """The inventory whose plan the stored pool matches (either of the two the test publishes)."""
    renamed = any(
        device["attributes"]["productName"] == {"string": "changed"}
        for s in stored
        for device in s["spec"].get("devices", [])
    )
    return with_product_name(MIG_NODE, 1, "changed") if renamed else MIG_NODE


async def test_a_slice_deleted_while_a_list_answer_is_on_its_way_is_still_recreated(
    server: ApiServer,
) -> None:
    """A write with an unknown outcome makes the next sync list first; a slice deleted after the
    server made that list's answer, and before it arrived, is told by the watch first. The late
    answer must not bring the slice back into the controller's copy (it would never be repaired:
    the watch does not tell the delete again)."""
    changed = with_product_name(MIG_NODE, 1, "changed")

    async with publishing(server, MIG_NODE, sync_delay=0.05) as published:
        await published.converged(server, MIG_NODE)
        victim = stored_slices(server)[3]["metadata"]["name"]
        lists = server.request_count("GET", SLICES)
        server.faults.fail_after_commit_next = 1
        server.faults.answer_delay_methods = frozenset({"GET"})
        server.faults.answer_delay_seconds = 0.5
        published.controller.set_inventory(changed)
        # The list after the ambiguous write has reached the server.
        await until(lambda: server.request_count("GET", SLICES) > lists)
        server.faults.answer_delay_methods = frozenset()
        foreign_delete(server, victim)
        await published.converged(server, changed, within=5)
        assert victim not in {s["metadata"]["name"] for s in stored_slices(server)}


OtherWriter = Callable[[dict[str, Any]], None]


async def _while_our_update_answer_is_held(server: ApiServer, other_writer: OtherWriter) -> None:
    """Publishes a one-device change whose update's answer the server holds back; meanwhile
    `other_writer` acts on the updated slice and the watch tells of it. Once our late answer has
    arrived, the controller must still converge on its plan."""
    changed = with_product_name(MIG_NODE, 1, "changed")

    async with publishing(server, MIG_NODE, sync_delay=0.05) as published:
        await published.converged(server, MIG_NODE)
        puts = server.request_count("PUT", SLICES)
        writes = server.writes(SLICES)
        server.faults.answer_delay_methods = frozenset({"PUT"})
        server.faults.answer_delay_seconds = 0.5
        published.controller.set_inventory(changed)
        # The update is stored; its answer is on its way.
        await until(lambda: server.request_count("PUT", SLICES) > puts and server.writes(SLICES) > 0)
        server.faults.answer_delay_methods = frozenset()
        other_writer(next(s for s in stored_slices(server) if s["metadata"]["name"].startswith("00000")))
        # The server counts a write as it answers it: the other writer's, then our late one.
        await until(lambda: server.writes(SLICES) >= writes + 2)
        await published.converged(server, changed, within=5)


async def test_a_write_answer_overtaken_by_another_writers_edit_does_not_hide_the_edit(
    server: ApiServer,
) -> None:
    """The copy keeps the later edit, so the sync delay repairs it."""

    def edit(updated: dict[str, Any]) -> None:
        edited = copy.deepcopy(updated)
        edited["spec"]["devices"] = edited["spec"]["devices"][:2]
        foreign_replace(server, edited)

    await _while_our_update_answer_is_held(server, edit)


async def test_a_slice_deleted_before_our_update_answer_arrives_is_still_recreated(server: ApiServer) -> None:
    """The answer must not bring the deleted slice back into the copy."""

    def delete(updated: dict[str, Any]) -> None:
        foreign_delete(server, updated["metadata"]["name"])

    await _while_our_update_answer_is_held(server, delete)


async def test_a_default_1_34_server_gets_static_mig_in_the_1_34_layout() -> None:
    """Partitionable devices and consumable capacity are alpha (off) in 1.34: dynamic MIG falls
    back to the instances that exist."""
    server = ApiServer(version="1.34").start()
    add_node(server)
    static = falling_back(MIG_NODE)(frozenset({"DRAPartitionableDevices"}))
    assert static is not None and not static.counter_sets

    try:
        async with publishing(server, MIG_NODE, sync_delay=0.05) as published:
            await published.converged(server, static)
            assert published.controller.status.layout == "1.34"
            assert published.controller.status.unsupported == {"DRAPartitionableDevices"}
            assert await quiet(server, 0.5) == 0
    finally:
        server.stop()
