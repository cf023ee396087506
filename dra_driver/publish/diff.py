"""What to write so the API server's slices of this node's pool equal the plan: a pure function.

It follows the upstream ResourceSlice controller (kubernetes/dynamic-resource-allocation
`resourceslice`, v0.36 naming), so the scheduler sees our pool exactly as it sees pools published
by the Go helper:
- the pool's generation is the highest among its slices; slices of lower generations are obsolete;
- desired slice i is matched with the stored slice whose name starts with its generateName
  (hex index first), so names keep the plan's order;
- the generation stays when nothing is created and at most one slice changes (one-device
  changes cost one write); otherwise it goes up by one and every kept slice is rewritten, so a
  reader never mixes slices of two plans;
- deletes go first, then updates, then creates.
"""

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from dra_driver.base.json_object import JsonObject


class NodeOwner(msgspec.Struct, frozen=True):
    """The Node the slices belong to: garbage collection removes them with the Node."""

    name: str
    uid: str

    def reference(self) -> JsonObject:
        return {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid, "controller": True}


class Create(msgspec.Struct, frozen=True):
    body: JsonObject

    def describe(self) -> str:
        return f"create {self.body['metadata']['generateName']}*"


class Update(msgspec.Struct, frozen=True):
    name: str
    body: JsonObject

    def describe(self) -> str:
        return f"update {self.name}"


class Delete(msgspec.Struct, frozen=True):
    name: str
    uid: str
    resource_version: str
    why: str

    def describe(self) -> str:
        return f"delete {self.name} ({self.why})"


Write = Create | Update | Delete


class SyncPlan(msgspec.Struct, frozen=True):
    generation: int
    deletes: tuple[Delete, ...] = ()
    updates: tuple[Update, ...] = ()
    creates: tuple[Create, ...] = ()

    @property
    def writes(self) -> tuple[Write, ...]:
        return (*self.deletes, *self.updates, *self.creates)


class Adopted(msgspec.Struct, frozen=True):
    """A spec we sent and the spec the server stored instead (it dropped fields it does not know).

    While both still hold, the slice counts as up to date: rewriting it would only be dropped again.
    """

    sent: Mapping[str, Any]
    stored: Mapping[str, Any]


class PoolState(msgspec.Struct, frozen=True):
    """Everything the diff reads: the stored slices of our driver and node, and what was adopted."""

    slices: Sequence[Mapping[str, Any]]
    adopted: Mapping[str, Adopted] = msgspec.field(default_factory=dict)


def _generation(stored: Mapping[str, Any]) -> int:
    generation = stored.get("spec", {}).get("pool", {}).get("generation", 0)
    return generation if isinstance(generation, int) else 0


def _name(stored: Mapping[str, Any]) -> str:
    return str(stored["metadata"]["name"])


def _delete(stored: Mapping[str, Any], why: str) -> Delete:
    metadata = stored["metadata"]
    return Delete(_name(stored), str(metadata.get("uid", "")), str(metadata.get("resourceVersion", "")), why)


def _keep_taint_times(desired_spec: JsonObject, stored_spec: Mapping[str, Any]) -> None:
    """The server stamps `timeAdded` on taints; a taint we still want keeps the stored time, or
    every sync would look like a change and reset it."""
    stored_taints = {
        device.get("name"): device.get("taints", []) for device in stored_spec.get("devices", []) or []
    }
    for device in desired_spec.get("devices", []):
        for taint in device.get("taints", []):
            for old in stored_taints.get(device["name"], []):
                same = all(old.get(key) == taint.get(key) for key in ("key", "value", "effect"))
                if same and "timeAdded" in old and "timeAdded" not in taint:
                    taint["timeAdded"] = old["timeAdded"]


def _with_generation(desired: Mapping[str, Any], generation: int, owner: NodeOwner) -> JsonObject:
    body = copy.deepcopy(dict(desired))
    body["spec"]["pool"]["generation"] = generation
    body["metadata"]["ownerReferences"] = [owner.reference()]
    return body


def _update(desired: JsonObject, stored: Mapping[str, Any]) -> Update:
    """The stored slice rewritten to `desired`, carrying its name, uid and resourceVersion so a
    concurrent change makes the write conflict instead of being overwritten."""
    body = copy.deepcopy(desired)
    _keep_taint_times(body["spec"], stored.get("spec", {}))
    metadata = stored["metadata"]
    body["metadata"] = {
        **{key: value for key, value in metadata.items() if key not in ("generateName", "managedFields")},
        "ownerReferences": desired["metadata"]["ownerReferences"],
    }
    return Update(_name(stored), body)


def _up_to_date(update: Update, stored: Mapping[str, Any], adopted: Adopted | None) -> bool:
    if stored["metadata"].get("ownerReferences") != update.body["metadata"]["ownerReferences"]:
        return False
    spec, stored_spec = update.body["spec"], stored.get("spec")
    if adopted is not None and adopted.sent == spec and adopted.stored == stored_spec:
        return True
    return bool(spec == stored_spec)


def plan_sync(
    desired: Sequence[Mapping[str, Any]], state: PoolState, pool_name: str, owner: NodeOwner
) -> SyncPlan:
    """`desired`: the slices as rendered by `devices.slices.slices_to_api` (any generation).

    `state.slices` holds what the API server has for our driver and node (its field selectors);
    slices of another pool there are ours by driver and node, so they are obsolete and go.
    """
    in_pool = [s for s in state.slices if s.get("spec", {}).get("pool", {}).get("name") == pool_name]
    deletes = [
        _delete(s, "not in this node's pool")
        for s in state.slices
        if s.get("spec", {}).get("pool", {}).get("name") != pool_name
    ]
    current = max((_generation(s) for s in in_pool), default=0)
    deletes += [
        _delete(s, f"obsolete generation {_generation(s)}") for s in in_pool if _generation(s) < current
    ]
    candidates = sorted((s for s in in_pool if _generation(s) == current), key=_name)

    at_current = [_with_generation(planned, current, owner) for planned in desired]
    matched: list[Mapping[str, Any] | None] = []
    for planned in at_current:
        prefix = planned["metadata"]["generateName"]
        same_index = [s for s in candidates if _name(s).startswith(prefix)]
        keep = next((s for s in same_index if planned["spec"] == s.get("spec")), None)
        keep = keep or (same_index[0] if same_index else None)
        matched.append(keep)
        deletes += [_delete(s, f"duplicate of {_name(keep)}") for s in same_index if keep and s is not keep]
        candidates = [s for s in candidates if not _name(s).startswith(prefix)]
    deletes += [_delete(s, "not in the plan") for s in candidates]

    kept = [(index, stored) for index, stored in enumerate(matched) if stored is not None]
    changed = [
        (index, stored)
        for index, stored in kept
        if not _up_to_date(_update(at_current[index], stored), stored, state.adopted.get(_name(stored)))
    ]
    creating = [index for index, stored in enumerate(matched) if stored is None]
    if current > 0 and not creating and len(changed) <= 1:
        generation, bodies, rewrite = current, at_current, changed
    else:
        generation = current + 1
        bodies = [_with_generation(planned, generation, owner) for planned in desired]
        rewrite = kept
    return SyncPlan(
        generation=generation,
        deletes=tuple(deletes),
        updates=tuple(_update(bodies[index], stored) for index, stored in rewrite),
        creates=tuple(Create(bodies[index]) for index in creating),
    )
