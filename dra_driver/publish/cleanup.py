"""`dra-driver cleanup`: remove this node's ResourceSlices, for uninstalling the driver.

The agent never deletes its slices when it stops (kubelet does that once the plugin is really
gone); an operator removing the driver from a node that keeps running uses this instead.
"""

from dra_driver.publish.diff import Delete
from dra_driver.publish.slice_api import ApiCallError, SliceApi

# A slice changed between our list and our delete is listed again; a node whose slices keep
# changing (an agent still running) is reported instead of fought.
ATTEMPTS = 5


async def remove_node_slices(api: SliceApi, dry_run: bool) -> tuple[Delete, ...]:
    """The deletes made (or, with dry_run, that would be made)."""
    done: list[Delete] = []
    for _ in range(ATTEMPTS):
        slices, _version = await api.list_slices()
        deletes = [
            Delete(
                str(item["metadata"]["name"]),
                str(item["metadata"].get("uid", "")),
                str(item["metadata"].get("resourceVersion", "")),
                "cleanup",
            )
            for item in slices
        ]
        if dry_run or not deletes:
            return (*done, *deletes)
        try:
            for delete in deletes:
                await api.delete_slice(delete.name, delete.uid, delete.resource_version)
                done.append(delete)
        except ApiCallError as error:
            if error.status != 409:
                raise
    raise ApiCallError(
        "cleanup",
        409,
        "Conflict",
        f"slices kept changing over {ATTEMPTS} attempts; is the agent still running?",
    )
