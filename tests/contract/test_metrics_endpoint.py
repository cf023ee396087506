"""The observability endpoint over real HTTP, as Prometheus and kubelet's probes use it."""

import asyncio
import http.client
import platform
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import __version__
from dra_driver.claims.errors import ClaimRejected
from dra_driver.health.census import device_labels
from dra_driver.health.model import DeviceHealth, HealthStatus, NodeHealth
from dra_driver.observability.metrics import AgentMetrics
from dra_driver.observability.server import (
    ListenAddress,
    MetricsAddressError,
    ObservabilityServer,
    Readiness,
    keep_heartbeat,
    parse_metrics_address,
)
from tests.support.nodes import inventory_for
from tests.support.waiting import until, wait_until

LOCAL = ListenAddress("127.0.0.1", 0)
# Proxy variables of the test machine must not route requests to 127.0.0.1 elsewhere.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Endpoint:
    server: ObservabilityServer
    metrics: AgentMetrics
    readiness: Readiness
    clock: FakeClock

    def get(self, path: str) -> tuple[int, str, str]:
        return get(self.server.port, path)


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET, error statuses included."""
    try:
        with OPENER.open(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode()


def raw_exchange(port: int, data: bytes) -> bytes:
    """Sends `data` as is and reads until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    clock = FakeClock()
    metrics = AgentMetrics()
    readiness = Readiness(clock=clock)
    server = ObservabilityServer(LOCAL, metrics.registry, readiness)
    server.start()
    yield Endpoint(server, metrics, readiness, clock)
    server.stop()


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_metrics_are_served_in_the_prometheus_text_format(endpoint: Endpoint) -> None:
    metrics = endpoint.metrics
    metrics.claims.prepare_duration.observe(0.003)
    metrics.claims.prepare_failed(ClaimRejected("device taken"))
    metrics.publish.slice_writes.labels(verb="create").inc(2)
    metrics.kubelet_registered.set(1)
    inventory = inventory_for("mixed", "default")
    unhealthy = DeviceHealth(HealthStatus.UNHEALTHY, since=0.0, message="XID 79")
    metrics.set_devices(device_labels(inventory, NodeHealth("node-a", {"gpu-4": unhealthy})))

    status, content_type, body = endpoint.get("/metrics")

    assert status == 200
    assert content_type == CONTENT_TYPE_LATEST
    scraped = families(body)
    prepare = scraped["dra_driver_prepare_duration_seconds"]
    assert prepare.type == "histogram"
    by_name = {(s.name, s.labels.get("le")): s.value for s in prepare.samples}
    assert by_name["dra_driver_prepare_duration_seconds_count", None] == 1
    assert by_name["dra_driver_prepare_duration_seconds_bucket", "0.0025"] == 0
    assert by_name["dra_driver_prepare_duration_seconds_bucket", "0.005"] == 1
    assert by_name["dra_driver_prepare_duration_seconds_sum", None] == pytest.approx(0.003)
    assert scraped["dra_driver_unprepare_duration_seconds"].type == "histogram"

    errors = {s.labels["reason"]: s.value for s in scraped["dra_driver_prepare_errors"].samples}
    assert errors == {"invalid_identity": 0, "claim_rejected": 1, "config": 0, "hardware": 0, "internal": 0}
    assert {s.value for s in scraped["dra_driver_unprepare_errors"].samples} == {0}

    (build,) = scraped["dra_driver_build_info"].samples
    assert build.labels == {"version": __version__, "python": platform.python_version()}
    assert build.value == 1
    (registered,) = scraped["dra_driver_kubelet_registered"].samples
    assert registered.value == 1

    devices = {(s.labels["type"], s.labels["health"]): s.value for s in scraped["dra_driver_devices"].samples}
    assert devices["gpu", "unhealthy"] == 1
    assert devices["gpu", "unknown"] == 3
    assert sum(devices.values()) == len(inventory.devices)

    (writes,) = scraped["dra_driver_resourceslice_writes"].samples
    assert writes.labels == {"verb": "create"} and writes.value == 2


def test_head_answers_like_get_without_a_body(endpoint: Endpoint) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.server.port, timeout=5)
    try:
        connection.request("HEAD", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type") == CONTENT_TYPE_LATEST
        assert int(response.getheader("Content-Length") or 0) > 0
        assert response.read() == b""
    finally:
        connection.close()


def test_healthz_fails_once_the_heartbeat_is_older_than_ten_seconds(endpoint: Endpoint) -> None:
    assert endpoint.get("/healthz") == (200, "text/plain; charset=utf-8", "ok\n")

    endpoint.clock.now += 10.0
    assert endpoint.get("/healthz")[0] == 200, "exactly at the limit is still alive"

    endpoint.clock.now += 2.5
    status, _, body = endpoint.get("/healthz")
    assert status == 503
    assert "event loop unresponsive" in body and "12.5 s ago" in body

    endpoint.readiness.heartbeat()
    assert endpoint.get("/healthz")[0] == 200


async def test_healthz_answers_while_the_event_loop_is_blocked() -> None:
    """The endpoint's own threads answer the probe, so a stuck loop is reported, not hidden."""
    readiness = Readiness(stale_after=0.3)
    server = ObservabilityServer(LOCAL, AgentMetrics().registry, readiness)
    server.start()

    try:
        beating = asyncio.create_task(keep_heartbeat(readiness, interval=0.02))
        try:
            assert (await asyncio.to_thread(get, server.port, "/healthz"))[0] == 200
            # Blocking the loop is the point: no heartbeat runs until the probe has answered. The
            # wait polls without letting the loop run, until the last beat is too old.
            wait_until(lambda: readiness.liveness_problem() is not None, timeout=5)
            status, _, body = get(server.port, "/healthz")
            assert status == 503, body
            await until(lambda: readiness.liveness_problem() is None)  # the loop beats again
            assert (await asyncio.to_thread(get, server.port, "/healthz"))[0] == 200
        finally:
            beating.cancel()
    finally:
        server.stop()


def test_readyz_names_what_is_missing_until_registered_and_published(endpoint: Endpoint) -> None:
    status, _, body = endpoint.get("/readyz")
    assert status == 503
    assert body == "not ready: not registered with kubelet; ResourceSlices not published\n"

    endpoint.readiness.registered(True)
    assert endpoint.get("/readyz")[1:] == (
        "text/plain; charset=utf-8",
        "not ready: ResourceSlices not published\n",
    )
    assert endpoint.get("/readyz")[0] == 503

    endpoint.readiness.published(True)
    assert endpoint.get("/readyz") == (200, "text/plain; charset=utf-8", "ok\n")

    endpoint.readiness.registered(False)
    assert endpoint.get("/readyz")[:3] == (
        503,
        "text/plain; charset=utf-8",
        "not ready: not registered with kubelet\n",
    )


@pytest.mark.parametrize("path", ["/", "/metrics/", "/metricsx", "/healthz/extra", "/favicon.ico"])
def test_other_paths_are_not_found(endpoint: Endpoint, path: str) -> None:
    status, _, body = endpoint.get(path)
    assert status == 404
    assert "/metrics" in body


def test_a_query_string_does_not_change_the_answer(endpoint: Endpoint) -> None:
    assert endpoint.get("/healthz?verbose=1")[0] == 200
    assert endpoint.get("/readyz?verbose")[0] == 503


@pytest.mark.parametrize(
    ("request_bytes", "status_line"),
    [
        pytest.param(b"NOT A REQUEST LINE\r\n\r\n", b"HTTP/1.0 400 ", id="four words"),
        pytest.param(b"\x16\x03\x01\x02 \x00\x01\r\n\r\n", b"HTTP/1.0 400 ", id="TLS hello"),
        pytest.param(b"GET /metrics HTTP/9.9\r\n\r\n", b"HTTP/1.0 505 ", id="unknown version"),
        pytest.param(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", b"HTTP/1.0 414 ", id="too long"),
        pytest.param(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.0 501 ", id="POST"),
        pytest.param(b"GET /healthz\r\n\r\n", b"HTTP/1.0 200 ", id="no version"),
    ],
)
def test_bad_requests_get_an_error_and_the_server_keeps_serving(
    endpoint: Endpoint, request_bytes: bytes, status_line: bytes
) -> None:
    answer = raw_exchange(endpoint.server.port, request_bytes)

    assert answer.startswith(status_line), answer[:200]
    assert endpoint.get("/healthz")[0] == 200


def test_clients_that_hang_up_or_stay_silent_do_not_stop_the_server(endpoint: Endpoint) -> None:
    port = endpoint.server.port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
        silent.sendall(b"GET /metr")
        assert endpoint.get("/healthz")[0] == 200


def test_a_failing_collector_gives_500_and_the_server_keeps_serving(endpoint: Endpoint) -> None:
    class Broken:
        def collect(self) -> Iterator[Metric]:
            raise RuntimeError("collector bug")

    endpoint.metrics.registry.register(Broken())

    assert endpoint.get("/metrics")[:2] == (500, "text/plain; charset=utf-8")
    assert endpoint.get("/healthz")[0] == 200


def test_stop_is_prompt_with_a_client_still_connected_and_closes_the_port() -> None:
    server = ObservabilityServer(LOCAL, CollectorRegistry(), Readiness())
    server.start()
    port = server.port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        # Connections are accepted in order: once this one is answered, the slow one has a thread.
        assert get(port, "/healthz")[0] == 200
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 2

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_taken_port_fails_the_start() -> None:
    first = ObservabilityServer(LOCAL, CollectorRegistry(), Readiness())
    first.start()
    try:
        second = ObservabilityServer(ListenAddress("127.0.0.1", first.port), CollectorRegistry(), Readiness())
        with pytest.raises(OSError):
            second.start()
    finally:
        first.stop()


def test_every_interface_takes_ipv4_clients() -> None:
    server = ObservabilityServer(ListenAddress("", 0), CollectorRegistry(), Readiness())
    server.start()
    try:
        assert get(server.port, "/healthz")[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        (":9400", ListenAddress("", 9400)),
        ("0.0.0.0:9400", ListenAddress("0.0.0.0", 9400)),
        ("127.0.0.1:0", ListenAddress("127.0.0.1", 0)),
        ("[::]:9400", ListenAddress("::", 9400)),
        ("[0:0::1]:65535", ListenAddress("::1", 65535)),
    ],
)
def test_metrics_addresses(value: str, expected: ListenAddress | None) -> None:
    assert parse_metrics_address(value) == expected


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("9400", "must be host:port"),
        ("localhost:9400", "is not an IP address"),
        ("1.2.3.4:65536", "from 0 to 65535"),
        ("1.2.3.4:", "from 0 to 65535"),
        (":http", "from 0 to 65535"),
        (":-1", "from 0 to 65535"),
        (":٩٤", "from 0 to 65535"),
        ("::1:9400", "in brackets"),
        ("[1.2.3.4]:9400", "brackets are for IPv6"),
        ("[::1]", "in brackets"),
        ("1.2.3.4.5:9400", "is not an IP address"),
    ],
)
def test_bad_metrics_addresses_name_the_flag(value: str, problem: str) -> None:
    with pytest.raises(MetricsAddressError) as error:
        parse_metrics_address(value)

    message = str(error.value)
    assert message.startswith("--metrics-address (DRA_DRIVER_METRICS_ADDRESS): ")
    assert repr(value) in message and problem in message


def test_listen_addresses_print_as_they_are_written() -> None:
    assert [str(ListenAddress(host, 9400)) for host in ("", "10.0.0.1", "::1")] == [
        ":9400",
        "10.0.0.1:9400",
        "[::1]:9400",
    ]
