"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz and /readyz for kubelet's probes.

It runs on threads of its own (stdlib `ThreadingHTTPServer`), not on the agent's event loop, so
that /healthz can still answer while the loop is stuck, and say so: the loop proves it is alive
by a heartbeat every second, and a heartbeat older than `HEARTBEAT_STALE_SECONDS` fails the
probe, which makes kubelet restart the agent. Nothing a client sends can reach the agent: a
handler's failure ends that one connection.
"""

import asyncio
import ipaddress
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import msgspec
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from dra_driver import __version__
from dra_driver.base.errors import OperatorFault

log = structlog.get_logger("dra_driver.observability")

METRICS_ADDRESS_FLAG = "--metrics-address (DRA_DRIVER_METRICS_ADDRESS)"
HEARTBEAT_INTERVAL_SECONDS = 1.0
HEARTBEAT_STALE_SECONDS = 10.0
# A client that sends nothing for this long loses its connection (and its thread).
CLIENT_TIMEOUT_SECONDS = 10.0
# How often the idle server looks for a stop request: the most stop() waits, at no measurable cost.
STOP_POLL_SECONDS = 0.1
TEXT = "text/plain; charset=utf-8"


class MetricsAddressError(OperatorFault, ValueError):
    """A bad --metrics-address; the message names the flag and what was expected."""


class ListenAddress(msgspec.Struct, frozen=True):
    # An IP address; "" for every interface (IPv6 and IPv4 where the node has both).
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _address_error(value: str, expected: str) -> MetricsAddressError:
    return MetricsAddressError(f"{METRICS_ADDRESS_FLAG}: {value!r}: {expected}")


def parse_metrics_address(value: str) -> ListenAddress | None:
    """`host:port`, `[ipv6]:port` or `:port`; "" turns the endpoint off (None).

    Only IP addresses are taken, not host names: a name would be resolved once, at start, to
    whichever address DNS returned first, which is rarely what an operator meant to bind."""
    if not value:
        return None
    host, separator, port_text = value.rpartition(":")
    if not separator:
        raise _address_error(value, "must be host:port, [ipv6]:port or :port (empty turns it off)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise _address_error(value, "brackets are for IPv6 addresses only")
    elif ":" in host:
        raise _address_error(value, "write an IPv6 address in brackets, as [address]:port")
    if not (port_text.isascii() and port_text.isdigit() and int(port_text) <= 65535):
        raise _address_error(value, "the port must be a number from 0 to 65535")
    if host:
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            raise _address_error(
                value, f"{host!r} is not an IP address (leave the host out, as in :9400, for every interface)"
            ) from None
    return ListenAddress(host, int(port_text))


class Readiness:
    """What the probes report, set from the agent's event loop and read by the server's threads.

    Each setter replaces one attribute, which is atomic under the GIL, so no lock is needed.
    The object's creation counts as the first heartbeat: start-up gets the same grace as any
    other stretch of the loop's work."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, stale_after: float = HEARTBEAT_STALE_SECONDS
    ) -> None:
        self._clock = clock
        self._stale_after = stale_after
        self._last_heartbeat = clock()
        self._registered = False
        self._published = False

    def heartbeat(self) -> None:
        self._last_heartbeat = self._clock()

    def registered(self, value: bool) -> None:
        """Whether kubelet has accepted the plugin's registration."""
        self._registered = value

    def published(self, value: bool) -> None:
        """Whether the node's ResourceSlices have been written, so the scheduler sees its devices."""
        self._published = value

    def liveness_problem(self) -> str | None:
        silent = self._clock() - self._last_heartbeat
        if silent > self._stale_after:
            return (
                f"event loop unresponsive: last heartbeat {silent:.1f} s ago (limit {self._stale_after:g} s)"
            )
        return None

    def readiness_problems(self) -> list[str]:
        problems = []
        if not self._registered:
            problems.append("not registered with kubelet")
        if not self._published:
            problems.append("ResourceSlices not published")
        return problems


async def keep_heartbeat(readiness: Readiness, interval: float = HEARTBEAT_INTERVAL_SECONDS) -> None:
    """Runs on the agent's event loop until cancelled: each beat proves the loop got a turn."""
    while True:
        readiness.heartbeat()
        await asyncio.sleep(interval)


class Response(msgspec.Struct, frozen=True):
    status: HTTPStatus
    body: bytes
    content_type: str = TEXT


def _text(status: HTTPStatus, text: str) -> Response:
    return Response(status, (text + "\n").encode())


def respond(path: str, registry: CollectorRegistry, readiness: Readiness) -> Response:
    """The answer to a GET of `path` (query string ignored)."""
    match urlsplit(path).path:
        case "/metrics":
            return Response(HTTPStatus.OK, generate_latest(registry), CONTENT_TYPE_LATEST)
        case "/healthz":
            problem = readiness.liveness_problem()
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, problem) if problem else _text(HTTPStatus.OK, "ok")
        case "/readyz":
            problems = readiness.readiness_problems()
            if problems:
                return _text(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: " + "; ".join(problems))
            return _text(HTTPStatus.OK, "ok")
        case _:
            return _text(HTTPStatus.NOT_FOUND, "not found: try /metrics, /healthz or /readyz")


class _Handler(BaseHTTPRequestHandler):
    # A request line without a version ("GET /") is answered with a status line and headers;
    # the stdlib's HTTP/0.9 default would send a bare body, and a bare 400 for garbage.
    default_request_version = "HTTP/1.0"
    server_version = f"dra-driver/{__version__}"
    sys_version = ""
    timeout = CLIENT_TIMEOUT_SECONDS

    def __init__(
        self,
        request: socket.socket,
        client_address: Any,
        server: "_Server",
        *,
        registry: CollectorRegistry,
        readiness: Readiness,
    ) -> None:
        self._registry = registry
        self._readiness = readiness
        super().__init__(request, client_address, server)  # handles the request

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        try:
            response = respond(self.path, self._registry, self._readiness)
        except Exception:
            log.exception("cannot answer a request to the observability endpoint", path=self.path[:200])
            response = _text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if send_body:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: their requests are debug detail, not the agent's log."""
        log.debug("observability request", client=self.address_string(), message=format % args)


class _Server(ThreadingHTTPServer):
    # Daemon threads are never joined: stop() does not wait for a slow client, whose thread ends
    # with its timeout (or with the process).
    daemon_threads = True

    def __init__(self, address: ListenAddress, registry: CollectorRegistry, readiness: Readiness) -> None:
        self._dual_stack = not address.host and socket.has_dualstack_ipv6()
        host = "::" if self._dual_stack else address.host or "0.0.0.0"
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def handler(request: socket.socket, client_address: Any, server: "_Server") -> _Handler:
            return _Handler(request, client_address, server, registry=registry, readiness=readiness)

        super().__init__((host, address.port), handler)

    def server_bind(self) -> None:
        """Binds without HTTPServer's reverse DNS lookup of the address, which can hang on a node
        with broken DNS; `server_name` is only read by CGI handlers."""
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Called inside the handler's `except`. A client that hangs up mid-answer (a scrape that
        timed out, a port scanner) is routine; anything else is a bug worth a traceback."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("observability client went away", client=str(client_address)[:100], exc_info=True)
        else:
            log.exception("observability connection failed", client=str(client_address)[:100])


class ObservabilityServer:
    """Serves /metrics, /healthz and /readyz from a daemon thread."""

    def __init__(self, address: ListenAddress, registry: CollectorRegistry, readiness: Readiness) -> None:
        self._address = address
        self._registry = registry
        self._readiness = readiness
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the kernel's choice when the address asked for port 0)."""
        if self._server is None:
            raise RuntimeError("the observability server is not started")
        return self._server.server_port

    def start(self) -> None:
        """Listens before returning, so a taken port fails the agent's start (OSError)."""
        self._server = _Server(self._address, self._registry, self._readiness)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(STOP_POLL_SECONDS,),
            name="observability-http",
            daemon=True,
        )
        self._thread.start()
        log.info("observability endpoint listening", address=str(self._address), port=self.port)

    def stop(self) -> None:
        """Blocks up to `STOP_POLL_SECONDS`; safe to call twice."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None
