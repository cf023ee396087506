"""The pod calls the agent makes for its MPS daemon pods: create, get, list and delete, in its own
namespace, on its own node. Each raises `ApiError` (`kube.calls`)."""

from dra_driver.base.json_object import JsonObject
from dra_driver.kube.calls import json_call
from dra_driver.kube.errors import ApiError
from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.kube.timeouts import TIMEOUTS

_PODS = "/api/v1/namespaces/{namespace}/pods"
_POD = _PODS + "/{name}"
_EVERY_POD = "/api/v1/pods"


class PodApi:
    def __init__(self, client: KubeClient, namespace: str, node_name: str) -> None:
        self._client = client
        self.namespace = namespace
        self.node_name = node_name

    async def create(self, body: JsonObject) -> JsonObject:
        """`conflict` when a pod of that name exists."""
        request = call(
            self._client,
            "POST",
            _PODS,
            path_params={"namespace": self.namespace},
            body=body,
            request_timeout=TIMEOUTS.request,
        )
        return await json_call(f"CREATE pod {body['metadata']['name']}", request)

    async def get(self, name: str) -> JsonObject | None:
        """The pod, or None when there is none of that name."""
        request = call(
            self._client,
            "GET",
            _POD,
            path_params={"namespace": self.namespace, "name": name},
            request_timeout=TIMEOUTS.request,
        )
        try:
            return await json_call(f"GET pod {name}", request, (200,))
        except ApiError as error:
            if error.not_found:
                return None
            raise

    async def list_on_node(self, label_selector: str) -> list[JsonObject]:
        return await list_pods(
            self._client, label_selector, f"spec.nodeName={self.node_name}", self.namespace
        )

    async def delete(self, name: str, uid: str = "") -> None:
        """Deletes the pod (only the very one with `uid`, when given); one already gone counts
        as deleted."""
        body: JsonObject = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        request = call(
            self._client,
            "DELETE",
            _POD,
            path_params={"namespace": self.namespace, "name": name},
            body=body,
            request_timeout=TIMEOUTS.request,
        )
        await json_call(f"DELETE pod {name}", request, (200, 202, 404))


async def list_pods(
    client: KubeClient, label_selector: str, field_selector: str, namespace: str | None = None
) -> list[JsonObject]:
    """The pods both selectors select, in `namespace` (None: in every namespace)."""
    request = call(
        client,
        "GET",
        _EVERY_POD if namespace is None else _PODS,
        path_params=None if namespace is None else {"namespace": namespace},
        query=[("labelSelector", label_selector), ("fieldSelector", field_selector)],
        request_timeout=TIMEOUTS.request,
    )
    listed = await json_call("LIST pods", request, (200,))
    return list(listed.get("items") or [])
