"""The pure sync plan: what the controller writes for each state of the API server."""

import copy
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.slices import plan_slices, slices_to_api
from dra_driver.publish.diff import (
    Adopted,
    Create,
    Delete,
    NodeOwner,
    PoolState,
    SyncPlan,
    Update,
    plan_sync,
)
from tests.support.nodes import inventory_for

DRIVER = "gpu.dra-driver.dev"
NODE = "node-a"
OWNER = NodeOwner(NODE, "0b6c3d1e-node-uid")
Slice = dict[str, Any]


def desired_for(inventory: Inventory) -> list[Slice]:
    return slices_to_api(plan_slices(inventory, "1.35"), DRIVER, NODE)


class FakeStore:
    """Applies writes the way the API server would: names from generateName, new
    resourceVersions, and preconditions and resourceVersions checked."""

    def __init__(self, slices: Sequence[Slice] = ()) -> None:
        self.versions = itertools.count(1000)
        self.suffixes = itertools.count()
        self.slices: dict[str, Slice] = {s["metadata"]["name"]: copy.deepcopy(s) for s in slices}

    def create(self, body: Mapping[str, Any], name: str | None = None) -> Slice:
        stored = copy.deepcopy(dict(body))
        metadata = stored["metadata"]
        metadata["name"] = name or f"{metadata.pop('generateName')}x{next(self.suffixes)}"
        metadata.update(uid=f"uid-{metadata['name']}", resourceVersion=str(next(self.versions)))
        self.slices[metadata["name"]] = stored
        return stored

    def apply(self, plan: SyncPlan) -> None:
        for write in plan.writes:
            match write:
                case Delete(name=name, uid=uid, resource_version=version):
                    held = self.slices.pop(name)
                    assert (held["metadata"]["uid"], held["metadata"]["resourceVersion"]) == (uid, version)
                case Update(name=name, body=body):
                    held = self.slices[name]
                    assert body["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
                    updated = copy.deepcopy(body)
                    updated["metadata"]["resourceVersion"] = str(next(self.versions))
                    self.slices[name] = updated
                case Create(body=body):
                    self.create(body)

    def state(self) -> PoolState:
        return PoolState(list(self.slices.values()))


def sync(store: FakeStore, desired: list[Slice]) -> SyncPlan:
    plan = plan_sync(desired, store.state(), NODE, OWNER)
    store.apply(plan)
    return plan


def assert_matches(store: FakeStore, desired: list[Slice]) -> None:
    stored = sorted(store.slices.values(), key=lambda s: s["metadata"]["name"])
    assert len(stored) == len(desired)
    generations = {s["spec"]["pool"]["generation"] for s in stored}
    assert len(generations) == 1
    for held, wanted in zip(stored, desired, strict=True):
        assert held["metadata"]["name"].startswith(wanted["metadata"]["generateName"])
        assert held["metadata"]["ownerReferences"] == [OWNER.reference()]
        expected_spec = copy.deepcopy(wanted["spec"])
        expected_spec["pool"]["generation"] = generations.pop()
        generations.add(expected_spec["pool"]["generation"])
        assert held["spec"] == expected_spec


def test_from_empty_every_slice_is_created_once_at_generation_one() -> None:
    desired = desired_for(inventory_for("dgx-h100-mig", "mig-dynamic"))
    store = FakeStore()

    plan = sync(store, desired)

    assert [type(write) for write in plan.writes] == [Create] * len(desired)
    assert plan.generation == 1
    assert_matches(store, desired)
    assert sync(store, desired).writes == ()


def test_one_changed_device_is_one_update_without_a_generation_bump() -> None:
    desired = desired_for(inventory_for("dgx-h100-mig", "mig-dynamic"))
    store = FakeStore()
    sync(store, desired)
    changed = copy.deepcopy(desired)
    changed[0]["spec"]["devices"][3]["attributes"]["productName"] = {"string": "renamed"}

    plan = sync(store, changed)

    assert (len(plan.updates), len(plan.creates), len(plan.deletes), plan.generation) == (1, 0, 0, 1)
    assert_matches(store, changed)


def test_two_changed_slices_bump_the_generation_and_rewrite_every_slice() -> None:
    desired = desired_for(inventory_for("dgx-h100-mig", "mig-dynamic"))
    store = FakeStore()
    sync(store, desired)
    changed = copy.deepcopy(desired)
    for index in (0, 1):
        changed[index]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "renamed"}

    plan = sync(store, changed)

    assert (len(plan.updates), plan.generation) == (len(desired), 2)
    assert_matches(store, changed)


def test_a_deleted_slice_is_recreated_and_the_others_move_to_the_new_generation() -> None:
    desired = desired_for(inventory_for("dgx-h100-mig", "mig-dynamic"))
    store = FakeStore()
    sync(store, desired)
    del store.slices[sorted(store.slices)[1]]

    plan = sync(store, desired)

    assert (len(plan.creates), len(plan.updates), plan.generation) == (1, len(desired) - 1, 2)
    assert_matches(store, desired)


def test_fewer_slices_delete_the_rest_and_bump_the_generation() -> None:
    many = desired_for(inventory_for("b200x8-mig", "mig-dynamic"))
    few = desired_for(inventory_for("dgx-h100", "default"))
    store = FakeStore()
    sync(store, many)

    plan = sync(store, few)

    assert len(plan.deletes) == len(many) - len(few)
    assert plan.writes[: len(plan.deletes)] == plan.deletes, "deletes go first"
    assert_matches(store, few)


def test_obsolete_generations_duplicates_and_foreign_pools_are_deleted() -> None:
    desired = desired_for(inventory_for("dgx-h100", "default"))
    (only,) = desired
    store = FakeStore()
    old = copy.deepcopy(only)
    old["spec"]["pool"]["generation"] = 1
    old["metadata"]["ownerReferences"] = [OWNER.reference()]
    current = copy.deepcopy(old)
    current["spec"]["pool"]["generation"] = 2
    store.create(old, "00000-gpu.dra-driver.dev-node-a-old")
    kept = store.create(current, "00000-gpu.dra-driver.dev-node-a-kept")
    store.create(current, "00000-gpu.dra-driver.dev-node-a-twin")
    foreign = copy.deepcopy(current)
    foreign["spec"]["pool"]["name"] = "renamed-pool"
    store.create(foreign, "00000-gpu.dra-driver.dev-node-a-pool")

    plan = sync(store, desired)

    assert sorted(write.name for write in plan.deletes) == [
        "00000-gpu.dra-driver.dev-node-a-old",
        "00000-gpu.dra-driver.dev-node-a-pool",
        "00000-gpu.dra-driver.dev-node-a-twin",
    ]
    assert (plan.updates, plan.creates, plan.generation) == ((), (), 2)
    assert list(store.slices) == [kept["metadata"]["name"]]


def test_a_lost_owner_reference_is_restored() -> None:
    desired = desired_for(inventory_for("t4x4", "default"))
    store = FakeStore()
    sync(store, desired)
    (name,) = store.slices
    store.slices[name]["metadata"]["ownerReferences"] = []

    plan = sync(store, desired)

    assert [write.name for write in plan.updates] == [name]
    assert_matches(store, desired)


def test_what_the_server_adopted_is_not_rewritten_while_it_still_holds() -> None:
    desired = desired_for(inventory_for("t4x4", "vgpu-capacity"))
    store = FakeStore()
    sync(store, desired)
    (name,) = store.slices
    sent = copy.deepcopy(store.slices[name]["spec"])
    for device in store.slices[name]["spec"]["devices"]:
        device.pop("allowMultipleAllocations")
    stripped = store.slices[name]["spec"]

    assert len(plan_sync(desired, store.state(), NODE, OWNER).updates) == 1
    adopted = PoolState(list(store.slices.values()), {name: Adopted(sent=sent, stored=stripped)})
    assert plan_sync(desired, adopted, NODE, OWNER).writes == ()


def test_taints_keep_the_time_the_server_stamped() -> None:
    desired = desired_for(inventory_for("t4x4", "default"))
    desired[0]["spec"]["devices"][0]["taints"] = [{"key": "gpu.dra-driver.dev/xid", "effect": "NoSchedule"}]
    store = FakeStore()
    sync(store, desired)
    (name,) = store.slices
    store.slices[name]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-21T10:00:00Z"

    assert plan_sync(desired, store.state(), NODE, OWNER).writes == ()
    changed = copy.deepcopy(desired)
    changed[0]["spec"]["devices"][1]["attributes"]["productName"] = {"string": "renamed"}
    (update,) = plan_sync(changed, store.state(), NODE, OWNER).updates
    assert update.body["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-11-21T10:00:00Z"


PROFILES = ("dgx-h100-mig", "dgx-h100", "b200x8-mig", "mixed", "t4x4", "a30x4")
MODES = ("default", "mig-dynamic", "vgpu-partitions", "vgpu-capacity")


@st.composite
def stored_states(draw: st.DrawFn) -> tuple[list[Slice], FakeStore]:
    """A store left by earlier plans, then damaged: slices deleted, edited, duplicated."""
    store = FakeStore()
    for _ in range(draw(st.integers(0, 3))):
        sync(store, desired_for(inventory_for(draw(st.sampled_from(PROFILES)), "default")))
    names = sorted(store.slices)
    for name in draw(st.lists(st.sampled_from(names), unique=True)) if names else []:
        action = draw(st.sampled_from(("delete", "edit", "duplicate", "old")))
        held = store.slices[name]
        if action == "delete":
            del store.slices[name]
        elif action == "edit":
            held["spec"]["devices"] = held["spec"].get("devices", [])[:1]
        elif action == "duplicate":
            store.create(held, held["metadata"]["name"] + "-twin")
        else:
            held["spec"]["pool"]["generation"] = 0
    profile = draw(st.sampled_from(PROFILES))
    return desired_for(inventory_for(profile, draw(st.sampled_from(MODES)))), store


@settings(max_examples=60, deadline=None)
@given(stored_states())
def test_any_stored_state_converges_in_one_round(case: tuple[list[Slice], FakeStore]) -> None:
    desired, store = case

    sync(store, desired)

    assert_matches(store, desired)
    assert plan_sync(desired, store.state(), NODE, OWNER).writes == ()
