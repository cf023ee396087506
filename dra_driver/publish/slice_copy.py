"""The ResourceSlice controller's copy of this node's stored slices, kept in resourceVersion order.

Three things tell the controller what the server stores: a list, the watch's events, and the
answers to its own writes. They arrive in any order (a slow list overtaken by watch events, the
answer to our write after the event of a later change, or of another writer's delete), so each
is taken only when it is newer than what the copy already shows; like client-go's mutation
cache, resourceVersions are ordered as integers.

Apart from the controller (`controller.py`) because it is this ordering alone, and pure: the
controller decides when to list, sync and write, and what a change schedules; the copy answers
what is stored now, and whether a list, an event or an answer changed it.
"""

from collections.abc import Iterable

from dra_driver.base.json_object import JsonObject


def version_number(resource_version: str) -> int:
    """resourceVersions are opaque, but every real server uses etcd revisions; like client-go's
    mutation cache we order them as integers, and treat anything else as newest."""
    return int(resource_version) if resource_version.isdigit() else 2**63


def resource_version(obj: JsonObject) -> int:
    return version_number(str(obj.get("metadata", {}).get("resourceVersion", "")))


class StoredSlices:
    """Our slices as the server stores them, by name, as far as the list, the watch and the
    answers to our writes have shown."""

    def __init__(self) -> None:
        self.by_name: dict[str, JsonObject] = {}
        self._listed_at = 0
        # The newest resourceVersion of our slices a list, a watch event or a write's answer showed.
        self.newest_seen = 0
        # Slices we deleted whose DELETED event has not come yet: their older events, still on
        # the way, must not bring them back into the copy.
        self._deleted_by_us: set[str] = set()
        # Slices another writer deleted, with the version of the delete: an answer to our write
        # of one that arrives after the delete's event must not bring it back into the copy.
        self._deleted_at: dict[str, int] = {}

    def forget_newest(self) -> None:
        """For a list while no watch runs: no event can be newer than it, so it is the truth even
        if versions went back (a restored etcd)."""
        self.newest_seen = 0

    def overtaken(self, resource_version: str) -> bool:
        """Whether a list answered at `resource_version` is older than changes the copy has
        already shown: taking it would bring back what they changed (a slice deleted since), and
        the watch will not tell us again."""
        return version_number(resource_version) < self.newest_seen

    def take_list(self, items: Iterable[JsonObject], resource_version: str) -> bool:
        """Replaces the copy with a list's answer (one not `overtaken`); whether the copy changed."""
        before = self.by_name
        self.by_name = {str(item["metadata"]["name"]): item for item in items}
        self._deleted_by_us.clear()
        self._deleted_at.clear()
        self._listed_at = self.newest_seen = version_number(resource_version)
        return before != self.by_name

    def take_event(self, kind: str, obj: JsonObject) -> str | None:
        """A watch event: the changed slice's name, or None when the copy already showed it (our
        own write, applied from its answer) or it is older than what the copy holds."""
        name = str(obj.get("metadata", {}).get("name", ""))
        version = resource_version(obj)
        self.newest_seen = max(self.newest_seen, version)
        if version <= self._listed_at:
            return None
        if name in self._deleted_by_us:
            if kind == "DELETED":
                self._deleted_by_us.discard(name)
            return None
        held = self.by_name.get(name)
        if held is not None and resource_version(held) >= version:
            return None  # our own write, already applied from its answer
        if kind == "DELETED":
            if held is None:
                return None
            del self.by_name[name]
            self._deleted_at[name] = version
        else:
            self.by_name[name] = obj
        return name

    def deleted(self, name: str) -> None:
        """Our delete of `name` was answered."""
        self._deleted_by_us.add(name)
        self.by_name.pop(name, None)

    def take_answer(self, stored: JsonObject) -> str:
        """The server's answer to our create or update: the slice's name."""
        name = str(stored["metadata"]["name"])
        version = resource_version(stored)
        held = self.by_name.get(name)
        known = resource_version(held) if held is not None else self._deleted_at.get(name, 0)
        if version > known:
            # Else a watch event of a later change or delete (another writer's) overtook this answer.
            self.by_name[name] = stored
        self.newest_seen = max(self.newest_seen, version)
        return name
