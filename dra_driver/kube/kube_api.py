"""The agent's Kubernetes client: JSON requests and watch streams over one keep-alive pool.

The agent speaks to the API server through `kube_http`, its own HTTP/1.1 client, rather than the
official client: the official one imports aiohttp, whose import, with the two TLS contexts it
builds from the system CA bundle, was the largest part of the agent's start, and its per-request
machinery cost twice the CPU of a claim GET through our pool (issue 31). The requests are the ones
the official client's generated methods make (a test sends both to one server and compares what
arrives): paths with their parameters escaped as it escapes them, its query encoding, JSON
bodies, Accept and Content-Type, the bearer token; the User-Agent names this driver, so the API
server's audit log does too.

The official client is still used, loaded at that moment, for a kubeconfig whose credentials come
from an exec plugin or an auth provider (`kube.kubeconfig`).
"""

import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote

from dra_driver import __version__
from dra_driver.base.compact_json import compact_json
from dra_driver.kube.http_wire import HttpAnswer
from dra_driver.kube.kube_http import HttpStream, KeepAliveClient
from dra_driver.kube.server_access import ServerAccess

Query = Iterable[tuple[str, str | int | bool]]

USER_AGENT = f"dra-driver/{__version__}"

# What quote(..., safe="") leaves as it is (RFC 3986 unreserved characters).
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


class KubeClient:
    """One API server, its credentials and the connection pool every call shares."""

    def __init__(self, server: ServerAccess) -> None:
        """Reads the CA and client certificate files: raises OSError when they cannot be loaded,
        ValueError for a server or proxy URL that is not http(s)."""
        self.server = server
        self.http = KeepAliveClient(
            server.url,
            ssl_context=server.tls_context(),
            tls_server_name=server.tls_server_name,
            proxy=server.proxy,
            max_connections=server.max_connections,
        )

    async def open_ahead(self, time_limit: float = 10.0) -> None:
        """The pool's first connection, opened now rather than by the first claim GET."""
        await self.http.open_ahead(time_limit)

    async def close(self) -> None:
        await self.http.close()


def _query_text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def target(path: str, path_params: Mapping[str, str] | None, query: Query) -> str:
    """`path` with its `{name}` placeholders filled from `path_params`, escaped as the official
    client escapes them (every character but letters, digits and `_.-~`), and the query, booleans
    as `true`/`false`."""
    for key, value in (path_params or {}).items():
        # Names the API server allows need no escaping: only the others pay for quote (every
        # claim GET's namespace and name, on the pod-startup path, are such names).
        escaped = value if _UNRESERVED.fullmatch(value) else quote(value, safe="")
        path = path.replace(f"{{{key}}}", escaped)
    encoded = "&".join(f"{key}={quote(_query_text(value))}" for key, value in query)
    return f"{path}?{encoded}" if encoded else path


async def request_headers(client: KubeClient, has_body: bool) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
    if has_body:
        headers["Content-Type"] = "application/json"
    authorization = await client.server.credentials.authorization()
    if authorization is not None:
        headers["Authorization"] = authorization
    return headers


async def call(
    client: KubeClient,
    method: str,
    path: str,
    *,
    path_params: Mapping[str, str] | None = None,
    query: Query = (),
    body: object = None,
    request_timeout: float,
) -> HttpAnswer:
    """One request, `body` sent as JSON, answered whole. Raises what `KeepAliveClient.request`
    raises when no (readable) answer came: OSError, TimeoutError, ValueError."""
    data = None if body is None else compact_json(body)
    headers = await request_headers(client, data is not None)
    return await client.http.request(method, target(path, path_params, query), headers, request_timeout, data)


async def open_watch(client: KubeClient, path: str, query: Query, time_limit: float) -> HttpStream:
    """A watch request (`query` holds `watch=true`), its events read from the stream as they
    come, all within `time_limit` seconds. Raises as `call`."""
    headers = await request_headers(client, False)
    return await client.http.open_stream(target(path, None, query), headers, time_limit)
