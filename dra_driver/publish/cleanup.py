"""`dra-driver cleanup`: remove the driver's ResourceSlices, for uninstalling it.

The agent never deletes its slices when it stops (kubelet does that once the plugin is really
gone); an operator removing the driver from a node that keeps running uses this instead.

A node whose agent still runs would publish its slices again at once (and fight the deletes), so
cleanup first looks for agent pods: a pod labelled app.kubernetes.io/name=dra-driver (the label
every object of the shipped manifests carries) on the node, in any phase but Succeeded or Failed,
whose container runs with DRA_DRIVER_NAME set to this driver, counts as a serving agent, and
cleanup refuses unless forced. Another installation's agents (another driver name) do not count:
they never publish this driver's slices.
"""

from typing import Any

from dra_driver.kube.errors import ApiError
from dra_driver.kube.kube_api import KubeClient
from dra_driver.kube.pod_api import list_pods
from dra_driver.kube.slice_api import SliceApi
from dra_driver.publish.diff import Delete

# A slice changed between our list and our delete is listed again; a node whose slices keep
# changing (an agent still running) is reported instead of fought.
ATTEMPTS = 5
AGENT_LABEL_SELECTOR = "app.kubernetes.io/name=dra-driver"
DRIVER_NAME_VARIABLE = "DRA_DRIVER_NAME"
_ENDED_PHASES = "status.phase!=Succeeded,status.phase!=Failed"


def every_node_slice_api(client: KubeClient, driver_name: str) -> SliceApi:
    """The driver's slices on every node: the same calls, selected by driver alone."""
    api = SliceApi(client, driver_name, node_name="")
    api.field_selector = f"spec.driver={driver_name}"
    return api


def _runs_driver(pod: dict[str, Any], driver_name: str) -> bool:
    """Whether a container of the pod is an agent of `driver_name` (the DaemonSet sets its name
    in the environment)."""
    containers = pod.get("spec", {}).get("containers") or []
    return any(
        variable.get("name") == DRIVER_NAME_VARIABLE and variable.get("value") == driver_name
        for container in containers
        for variable in container.get("env") or []
    )


async def agent_pods(client: KubeClient, driver_name: str, node_name: str | None) -> list[str]:
    """`namespace/name on node` of every agent pod of `driver_name` that is not finished, on
    `node_name` (None: on any node). Raises ApiError when the pods cannot be listed."""
    selector = _ENDED_PHASES if node_name is None else f"spec.nodeName={node_name},{_ENDED_PHASES}"
    items = await list_pods(client, AGENT_LABEL_SELECTOR, selector)
    return [
        f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']} on "
        f"{pod.get('spec', {}).get('nodeName') or '(no node yet)'}"
        for pod in items
        if _runs_driver(pod, driver_name)
    ]


async def refusal(client: KubeClient, driver_name: str, node_name: str | None) -> str:
    """Empty when no agent pod serves the node (None: any node); else the line saying why
    cleanup must not go on, which --force overrides."""
    where = node_name or "every node"
    try:
        agents = await agent_pods(client, driver_name, node_name)
    except ApiError as error:
        return f"cannot tell whether an agent still serves {where}: {error}; --force skips this check"
    if not agents:
        return ""
    return (
        f"an agent still serves {where} ({', '.join(agents)}), and would publish its slices "
        "again; uninstall it first, or give --force"
    )


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
        except ApiError as error:
            if not error.conflict:
                raise
    raise ApiError(
        "cleanup",
        409,
        "Conflict",
        f"slices kept changing over {ATTEMPTS} attempts; is the agent still running?",
    )
