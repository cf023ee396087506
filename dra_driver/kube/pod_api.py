"""The pod calls the agent makes for its MPS daemon pods: create, get, list and delete, in its own
namespace, on its own node, as raw JSON through the official client's REST layer (like SliceApi,
so no generated models join the agent's memory)."""

from typing import Any

from dra_driver.kube.kube_api import KubeClient, call
from dra_driver.publish.slice_api import ApiCallError, json_answer

REQUEST_TIMEOUT_SECONDS = 30.0
_PODS = "/api/v1/namespaces/{namespace}/pods"
_POD = _PODS + "/{name}"

JsonObject = dict[str, Any]


class PodApi:
    def __init__(self, client: KubeClient, namespace: str, node_name: str) -> None:
        self._client = client
        self.namespace = namespace
        self.node_name = node_name

    async def create(self, body: JsonObject) -> JsonObject:
        """Raises ApiCallError; status 409 when a pod of that name exists."""
        request = call(
            self._client,
            "POST",
            _PODS,
            path_params={"namespace": self.namespace},
            body=body,
            request_timeout=REQUEST_TIMEOUT_SECONDS,
        )
        return await json_answer(f"CREATE pod {body['metadata']['name']}", request)

    async def get(self, name: str) -> JsonObject | None:
        """The pod, or None when there is none of that name."""
        request = call(
            self._client,
            "GET",
            _POD,
            path_params={"namespace": self.namespace, "name": name},
            request_timeout=REQUEST_TIMEOUT_SECONDS,
        )
        try:
            return await json_answer(f"GET pod {name}", request, (200,))
        except ApiCallError as error:
            if error.status == 404:
                return None
            raise

    async def list_on_node(self, label_selector: str) -> list[JsonObject]:
        request = call(
            self._client,
            "GET",
            _PODS,
            path_params={"namespace": self.namespace},
            query=[("fieldSelector", f"spec.nodeName={self.node_name}"), ("labelSelector", label_selector)],
            request_timeout=REQUEST_TIMEOUT_SECONDS,
        )
        listed = await json_answer(f"LIST pods {label_selector}", request, (200,))
        return list(listed.get("items") or [])

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
            request_timeout=REQUEST_TIMEOUT_SECONDS,
        )
        try:
            await json_answer(f"DELETE pod {name}", request, (200, 202))
        except ApiCallError as error:
            if error.status != 404:
                raise
