"""A small, strict stand-in for the Kubernetes API server.

It speaks the real REST protocol (paths, verbs, Status objects, resourceVersion, UIDs), so the
driver and the tests use the official `kubernetes` client against it unchanged. It is strict
where the real server is: objects are validated against the upstream OpenAPI schemas
(`kubernetes-validate`, unknown fields refused), names must be valid, stale resourceVersions
conflict, claim specs are immutable and the status subresource is separate.

Run it in a background thread (`ApiServer.start()`) for tests, or as a process
(`python -m tests.support.apiserver`) where it must not share the GIL with what it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime
import itertools
import json
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from aiohttp import web

from dra_driver.k8s_names import dns_label_problem, dns_subdomain_problem

SERVER_VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0", "platform": "linux/amd64"}
SCHEMA_VERSION = "1.36.0"
_SERVER_OWNED_METADATA = ("uid", "creationTimestamp", "name", "namespace")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool
    immutable_spec: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCE_TYPES = (
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, True, True),
    ResourceType("", "v1", "nodes", "Node", False, True, False),
)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.details = code, reason, details or {}

    def response(self) -> web.Response:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(self),
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }
        return web.json_response(body, status=self.code)


@dataclass
class Faults:
    """Knobs tests turn to make the server misbehave."""

    latency_seconds: float = 0.0
    # Answers the next N requests (any verb) with this status code.
    fail_next: int = 0
    fail_status: int = 500


@dataclass
class Store:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    resource_version: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _validate(rtype: ResourceType, obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.path)
        raise ApiError(422, "Invalid", f"{rtype.kind} is invalid: {path}: {error.message}") from error


class ApiServer:
    def __init__(self) -> None:
        self.store = Store()
        self.faults = Faults()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        # Counted when a request arrives, before injected latency: tests wait on it.
        self.requests_received = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/version", self._version)
        for rtype in RESOURCE_TYPES:
            prefix = f"/apis/{rtype.group}/{rtype.version}" if rtype.group else f"/api/{rtype.version}"
            collection = (
                f"{prefix}/namespaces/{{namespace}}/{rtype.plural}"
                if rtype.namespaced
                else (f"{prefix}/{rtype.plural}")
            )
            app.router.add_get(collection, self._handler(rtype, self._list))
            app.router.add_post(collection, self._handler(rtype, self._create))
            app.router.add_get(collection + "/{name}", self._handler(rtype, self._get))
            app.router.add_put(collection + "/{name}", self._handler(rtype, self._update))
            app.router.add_delete(collection + "/{name}", self._handler(rtype, self._delete))
            if rtype.has_status:
                app.router.add_get(collection + "/{name}/status", self._handler(rtype, self._get))
                app.router.add_put(collection + "/{name}/status", self._handler(rtype, self._update_status))
        return app

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> ApiServer:
        """Serves from a background thread with its own event loop."""
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="stand-in-apiserver", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "tester"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def request_count(self, verb: str, plural: str) -> int:
        with self._lock:
            return self.store.requests[(verb, plural)]

    # -- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        with self._lock:
            self.requests_received += 1
        if self.faults.latency_seconds:
            await asyncio.sleep(self.faults.latency_seconds)
        with self._lock:
            failing = self.faults.fail_next > 0
            if failing:
                self.faults.fail_next -= 1
        try:
            if failing:
                raise ApiError(self.faults.fail_status, "InternalError", "injected fault")
            return await handler(request)
        except ApiError as error:
            return error.response()
        except web.HTTPNotFound:
            return ApiError(404, "NotFound", "the server could not find the requested resource").response()
        except web.HTTPMethodNotAllowed:
            return ApiError(405, "MethodNotAllowed", "the server does not allow this method").response()

    def _handler(
        self, rtype: ResourceType, method: Callable[[ResourceType, web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            with self._lock:
                self.store.requests[(request.method, rtype.plural)] += 1
            return await method(rtype, request)

        return handle

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(SERVER_VERSION)

    def _key(
        self, rtype: ResourceType, request: web.Request, name: str | None = None
    ) -> tuple[str, str, str]:
        namespace = request.match_info.get("namespace", "")
        if rtype.namespaced and (problem := dns_label_problem(namespace)):
            raise ApiError(400, "BadRequest", f"invalid namespace: {problem}")
        return rtype.plural, namespace, name if name is not None else request.match_info["name"]

    def _not_found(self, rtype: ResourceType, name: str) -> ApiError:
        return ApiError(
            404,
            "NotFound",
            f'{rtype.group_resource} "{name}" not found',
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    async def _body(self, rtype: ResourceType, request: web.Request) -> dict[str, Any]:
        # Like the real server, a request without Content-Type is read as JSON (the official client
        # sends none on create).
        if "Content-Type" in request.headers and request.content_type != "application/json":
            raise ApiError(415, "UnsupportedMediaType", f"unsupported media type {request.content_type!r}")
        try:
            body = json.loads(await request.read())
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"invalid JSON: {error}") from error
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        for key, expected in (("apiVersion", rtype.api_version), ("kind", rtype.kind)):
            if body.setdefault(key, expected) != expected:
                raise ApiError(400, "BadRequest", f"{key} {body[key]!r} does not match {expected!r}")
        metadata = body.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        return body

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self.store.resource_version))

    # -- verbs -------------------------------------------------------------------------------------

    async def _get(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        with self._lock:
            obj = self.store.objects.get(key)
            if obj is None:
                raise self._not_found(rtype, key[2])
            return web.json_response(obj)

    async def _list(self, rtype: ResourceType, request: web.Request) -> web.Response:
        namespace = request.match_info.get("namespace", "")
        with self._lock:
            items = [
                obj
                for (plural, ns, _), obj in sorted(self.store.objects.items())
                if plural == rtype.plural and ns == namespace
            ]
            version = str(next(self.store.resource_version))
        return web.json_response(
            {
                "apiVersion": rtype.api_version,
                "kind": f"{rtype.kind}List",
                "metadata": {"resourceVersion": version},
                "items": items,
            }
        )

    async def _create(self, rtype: ResourceType, request: web.Request) -> web.Response:
        body = await self._body(rtype, request)
        metadata = body["metadata"]
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if problem := dns_subdomain_problem(name):
            raise ApiError(422, "Invalid", f"metadata.name: {problem}")
        if "resourceVersion" in metadata:
            raise ApiError(400, "BadRequest", "resourceVersion should not be set on objects to be created")
        key = self._key(rtype, request, name)
        if rtype.namespaced and metadata.setdefault("namespace", key[1]) != key[1]:
            raise ApiError(400, "BadRequest", "metadata.namespace does not match the request path")
        if rtype.has_status:
            body.pop("status", None)  # as the real server does: status is written through /status only
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = _now()
        _validate(rtype, body)
        with self._lock:
            if key in self.store.objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{rtype.group_resource} "{name}" already exists',
                    {"name": name, "group": rtype.group, "kind": rtype.plural},
                )
            self._stamp(body)
            self.store.objects[key] = body
        return web.json_response(body, status=201)

    def _replace(
        self,
        rtype: ResourceType,
        key: tuple[str, str, str],
        body: dict[str, Any],
        merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
    ) -> dict[str, Any]:
        with self._lock:
            current = self.store.objects.get(key)
            if current is None:
                raise self._not_found(rtype, key[2])
            sent_version = body["metadata"].get("resourceVersion")
            if sent_version and sent_version != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {rtype.group_resource} "
                    f'"{key[2]}": the object has been modified; please apply your changes to the '
                    "latest version and try again",
                    {"name": key[2], "kind": rtype.plural},
                )
            if body["metadata"].get("uid") not in (None, current["metadata"]["uid"]):
                raise ApiError(409, "Conflict", "metadata.uid does not match the stored object")
            updated = merge(copy.deepcopy(current), body)
            _validate(rtype, updated)
            self._stamp(updated)
            self.store.objects[key] = updated
            return updated

    async def _update(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        body = await self._body(rtype, request)

        def merge(current: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
            if rtype.immutable_spec and sent.get("spec") != current.get("spec"):
                raise ApiError(422, "Invalid", f"{rtype.kind} spec: field is immutable")
            kept = {k: v for k, v in current["metadata"].items() if k in _SERVER_OWNED_METADATA}
            current["metadata"] = {**sent["metadata"], **kept}
            current["spec"] = sent.get("spec")  # status is only written through /status
            return current

        return web.json_response(self._replace(rtype, key, body, merge))

    async def _update_status(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        body = await self._body(rtype, request)

        def merge(current: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
            current["status"] = sent.get("status")
            if current["status"] is None:
                del current["status"]
            return current

        return web.json_response(self._replace(rtype, key, body, merge))

    async def _delete(self, rtype: ResourceType, request: web.Request) -> web.Response:
        key = self._key(rtype, request)
        with self._lock:
            obj = self.store.objects.pop(key, None)
        if obj is None:
            raise self._not_found(rtype, key[2])
        return web.json_response(obj)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", required=True, type=Path, help="written once the server listens")
    args = parser.parse_args()

    async def run() -> None:
        server = ApiServer()
        await server.serve(port=args.port)
        server.write_kubeconfig(args.kubeconfig)
        print(server.url, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
