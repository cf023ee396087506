"""ResourceClaim status.devices after prepare (KEP-4817), written through the stand-in API server's
status subresource by the official client's REST layer, with the faults the stand-in injects.

The stand-in validates every written claim strictly against the upstream schema of its version,
so a write that 1.34 to 1.37 would refuse fails these tests where it is made.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import structlog.testing
from kubernetes import client, config

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.agent.kube_client import kubernetes_api_client
from dra_driver.base.backoff import Backoff
from dra_driver.claims.engine import ClaimEngine, RawClaim
from dra_driver.claims.source import ApiServerClaimSource
from dra_driver.claims.status.status_writer import CONCURRENCY, ClaimStatusWriter
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.kube.claim_api import ClaimApi
from dra_driver.kube.timeouts import TIMEOUTS
from dra_driver.observability.logs import merge_log_context
from dra_driver.observability.metrics import ClaimStatusMetrics
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate, allocate_results
from tests.support.engines import simulated_engine, simulated_hardware
from tests.support.image import IMAGE_ENVIRONMENT
from tests.support.k8s_schemas import KUBERNETES_VERSIONS
from tests.support.nodes import simulated_node
from tests.support.waiting import until, wait_until

DYNAMIC = NodeConfig(default=GpuSettings(mode="mig-dynamic"))
# Advisory limits: the status reports a share's grant whatever enforces it, and these nodes run no
# MPS daemons.
CAPACITY = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="none"))
OTHER_DRIVER = "net.example.com"
QUICK = Backoff(first=0.01, cap=0.05)


@dataclass
class Cluster:
    server: ApiServer
    claims: client.ResourceV1Api
    kubeconfig: Path


@pytest.fixture
def cluster(short_dir: Path) -> Iterator[Cluster]:
    with stand_in("1.36.0", short_dir) as running:
        yield running


@contextmanager
def stand_in(version: str, root: Path) -> Iterator[Cluster]:
    server = ApiServer(version=version.rsplit(".", 1)[0]).start()
    kubeconfig = server.write_kubeconfig(root / "kubeconfig")
    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        yield Cluster(server, client.ResourceV1Api(api_client), kubeconfig)
    finally:
        api_client.close()
        server.stop()


@dataclass
class Node:
    engine: ClaimEngine
    writer: ClaimStatusWriter
    metrics: ClaimStatusMetrics
    hardware: SimulatedBackend

    def count(self, result: str) -> float:
        value: float = self.metrics.writes.labels(result=result)._value.get()
        return value


@asynccontextmanager
async def node(
    cluster: Cluster, root: Path, profile: str, node_config: NodeConfig, settle_seconds: float = 0.0
) -> AsyncIterator[Node]:
    api = await kubernetes_api_client(cluster.kubeconfig)
    metrics = ClaimStatusMetrics()
    writer = ClaimStatusWriter(
        ClaimApi(api, TIMEOUTS.claim_status),
        DEFAULT_DRIVER_NAME,
        metrics,
        backoff=QUICK,
        settle_seconds=settle_seconds,
    )
    hardware = simulated_hardware(root, profile)
    engine = simulated_engine(
        root,
        ApiServerClaimSource(api),
        profile,
        node_config,
        hardware=hardware,
        claim_status=writer,
    )
    await engine.load_state()
    try:
        yield Node(engine, writer, metrics, hardware)
    finally:
        await writer.close()
        engine.close()
        await api.close()


def allocated(cluster: Cluster, name: str, *results: dict[str, Any]) -> RawClaim:
    full = [{"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": "node-a", **r} for r in results]
    return RawClaim("default", name, allocate_results(cluster.claims, name, full))


def stored(cluster: Cluster, name: str) -> dict[str, Any]:
    claim = cluster.claims.api_client.sanitize_for_serialization(
        cluster.claims.read_namespaced_resource_claim(name, "default")
    )
    assert isinstance(claim, dict)
    return claim


def devices_of(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = stored(cluster, name).get("status", {}).get("devices", [])
    return entries


def keys(entries: list[dict[str, Any]]) -> list[tuple[str, str, str, str | None]]:
    return [(e["driver"], e["pool"], e["device"], e.get("shareID")) for e in entries]


# --- what is written --------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
async def test_status_appears_after_prepare_with_the_mig_devices_facts(version: str, short_dir: Path) -> None:
    """On every supported version: the stand-in validates the write strictly, and so does this."""
    with stand_in(version, short_dir) as cluster:
        claim = allocated(cluster, "mig", {"device": "gpu-1-mig-1g10gb-3"})

        async def scenario() -> tuple[list[str], str]:
            async with node(cluster, short_dir, "dgx-h100-mig", DYNAMIC) as n:
                outcome = (await n.engine.prepare([claim]))[claim[2]]
                assert outcome.error == ""
                await n.writer.wait_idle()
                assert n.count("written") == 1
                (gpu,) = [gpu for gpu in await n.hardware.discover() if gpu.mig_instances]
                return list(outcome.devices[0].cdi_device_ids), gpu.mig_instances[0].uuid

        cdi_ids, mig_uuid = await scenario()
        (entry,) = devices_of(cluster, "mig")
        gpu_1 = simulated_node("dgx-h100-mig")[1]
        assert keys([entry]) == [(DEFAULT_DRIVER_NAME, "node-a", "gpu-1-mig-1g10gb-3", None)]
        assert entry["data"] == {
            "type": "mig",
            "gpuUUID": gpu_1.uuid,
            "gpuIndex": gpu_1.index,
            "migProfile": "1g.10gb",
            "migDeviceUUID": mig_uuid,
            "cdiDeviceIDs": cdi_ids,
        }
        (condition,) = entry["conditions"]
        assert {k: condition[k] for k in ("type", "status", "reason")} == {
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
        }
        assert condition["message"] == "prepared by the node agent on node-a"
        kubernetes_validate.validate(stored(cluster, "mig"), version, strict=True)


async def test_the_write_is_queued_and_the_prepare_logged_only_after_kubelet_has_its_answer(
    cluster: Cluster, short_dir: Path
) -> None:
    """Both are off the pod-startup path: when the engine's caller (the gRPC handler, which hands
    kubelet the answer) resumes, neither has happened; one loop turn later both have, the log
    line still naming its claim."""
    claim = allocated(cluster, "later", {"device": "gpu-0"})

    async with node(cluster, short_dir, "t4x4", NodeConfig(), settle_seconds=30.0) as n:
        with structlog.testing.capture_logs([merge_log_context]) as logged:
            assert (await n.engine.prepare([claim]))[claim[2]].error == ""
            at_answer = [*n.writer.pending, *(line["event"] for line in logged)]
            await asyncio.sleep(0)
            after = [*n.writer.pending, *(f"{line['event']} {line['claim_name']}" for line in logged)]
    assert at_answer == []
    assert after == [claim[2], "claim prepared later"]


async def test_a_vgpu_share_reports_its_limits(cluster: Cluster, short_dir: Path) -> None:
    share = str(uuid.uuid4())
    claim = allocated(
        cluster,
        "vgpu",
        {"device": "gpu-2", "shareID": share, "consumedCapacity": {"memory": "8Gi", "cores": "30"}},
    )

    async with node(cluster, short_dir, "t4x4", CAPACITY) as n:
        assert (await n.engine.prepare([claim]))[claim[2]].error == ""
        await n.writer.wait_idle()
    (entry,) = devices_of(cluster, "vgpu")
    assert keys([entry]) == [(DEFAULT_DRIVER_NAME, "node-a", "gpu-2", share)]
    assert entry["data"]["type"] == "vgpu"
    assert entry["data"]["vgpu"] == {"memoryLimitMiB": 8192, "coresLimitPercent": 30}
    assert entry["data"]["gpuUUID"] == simulated_node("t4x4")[2].uuid


async def test_other_drivers_entries_are_kept_and_ours_replaced_not_repeated(
    cluster: Cluster, short_dir: Path
) -> None:
    claim = allocated(
        cluster,
        "shared",
        {"device": "gpu-0"},
        {"request": "nic", "driver": OTHER_DRIVER, "pool": "nics", "device": "eth1"},
    )
    theirs = {
        "driver": OTHER_DRIVER,
        "pool": "nics",
        "device": "eth1",
        "networkData": {"interfaceName": "net1", "ips": ["10.0.0.7/24"]},
    }
    stale_ours = {"driver": DEFAULT_DRIVER_NAME, "pool": "node-a", "device": "gpu-0", "data": {"old": True}}
    body = stored(cluster, "shared")
    body["status"]["devices"] = [stale_ours, theirs]
    cluster.claims.replace_namespaced_resource_claim_status("shared", "default", body)

    async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
        assert (await n.engine.prepare([claim]))[claim[2]].error == ""
        await n.writer.wait_idle()
    entries = devices_of(cluster, "shared")
    assert keys(entries) == [
        (DEFAULT_DRIVER_NAME, "node-a", "gpu-0", None),
        (OTHER_DRIVER, "nics", "eth1", None),
    ]
    assert entries[1] == theirs
    assert "old" not in entries[0]["data"]


# --- faults -------------------------------------------------------------------------------------


async def test_5xx_conflicts_lost_answers_and_latency_lose_nothing_and_repeat_nothing(
    cluster: Cluster, short_dir: Path
) -> None:
    claims = [allocated(cluster, f"c{i}", {"device": f"gpu-{i}"}) for i in range(4)]
    faults = cluster.server.faults
    faults.latency_seconds = 0.02
    faults.fail_methods = frozenset({"PUT"})
    faults.fail_status = 503
    faults.fail_next = 3
    faults.conflict_next = 2
    faults.fail_after_commit_next = 1

    async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
        outcomes = await n.engine.prepare(claims)
        assert all(outcome.error == "" for outcome in outcomes.values()), "prepare never fails"
        await asyncio.wait_for(n.writer.wait_idle(), 10)
    for i in range(4):
        entries = devices_of(cluster, f"c{i}")
        assert keys(entries) == [(DEFAULT_DRIVER_NAME, "node-a", f"gpu-{i}", None)]
    assert n.count("failed") == 3 + 1  # the 503s, and the 500 of the write stored anyway
    assert n.count("conflict") == 2
    # The write whose answer was lost is found stored on the next attempt, not written twice.
    assert n.count("written") + n.count("unchanged") == 4
    assert n.count("unchanged") == 1
    assert n.writer.pending == frozenset()


async def test_a_deleted_claims_pending_write_is_dropped(cluster: Cluster, short_dir: Path) -> None:
    claim = allocated(cluster, "doomed", {"device": "gpu-1"})
    faults = cluster.server.faults
    faults.fail_methods = frozenset({"PUT"})
    faults.fail_next = 10**6

    async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
        assert (await n.engine.prepare([claim]))[claim[2]].error == "", "a failing write fails no prepare"
        await until(lambda: n.count("failed") >= 2)
        assert n.metrics.pending._value.get() == 1
        cluster.claims.delete_namespaced_resource_claim("doomed", "default")
        faults.fail_next = 0
        await asyncio.wait_for(n.writer.wait_idle(), 5)
    assert n.count("dropped") == 1
    assert n.count("written") == 0
    assert n.metrics.pending._value.get() == 0


async def test_unprepare_is_never_blocked_by_a_hanging_status_write(
    cluster: Cluster, short_dir: Path
) -> None:
    claim = allocated(cluster, "slow", {"device": "gpu-3"})
    faults = cluster.server.faults
    faults.answer_delay_methods = frozenset({"PUT"})
    faults.answer_delay_seconds = 3.0

    puts_before = cluster.server.request_count("PUT", "resourceclaims")  # the allocation's

    async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
        assert (await n.engine.prepare([claim]))[claim[2]].error == ""
        await until(lambda: cluster.server.request_count("PUT", "resourceclaims") == puts_before + 1)
        started = time.monotonic()
        assert await n.engine.unprepare([claim]) == {claim[2]: ""}
        took = time.monotonic() - started
        assert n.writer.pending == frozenset()
    assert took < 0.5, f"unprepare took {took:.2f} s behind a status write the server holds 3 s"
    assert n.count("dropped") == 1


async def test_a_refused_write_is_not_retried(cluster: Cluster, short_dir: Path) -> None:
    """403 (RBAC lacks resourceclaims/status or, on 1.36+, resourceclaims/driver): retrying
    cannot help, so the write is given up once and counted."""
    claim = allocated(cluster, "forbidden", {"device": "gpu-0"})
    faults = cluster.server.faults
    faults.fail_methods = frozenset({"PUT"})
    faults.fail_status = 403
    faults.fail_next = 10**6

    async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
        assert (await n.engine.prepare([claim]))[claim[2]].error == ""
        await asyncio.wait_for(n.writer.wait_idle(), 5)
    assert n.count("rejected") == 1
    assert n.count("failed") == 0
    assert faults.fail_next == 10**6 - 1, "one attempt"


# --- the agent, as deployed ---------------------------------------------------------------------


async def test_the_node_agent_writes_the_status_of_what_kubelet_prepared(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "pod-claim", {"gpu": "gpu-5"}, pool="node-a")

    answer = await kubelet_client.prepare(
        agent.dirs.dra_socket, "v1", [ClaimArg("default", "pod-claim", uid)]
    )

    def entries() -> list[dict[str, Any]]:
        claim = claims_api.read_namespaced_resource_claim("pod-claim", "default")
        return [claims_api.api_client.sanitize_for_serialization(d) for d in claim.status.devices or []]

    wait_until(lambda: bool(entries()))
    (entry,) = entries()
    assert (entry["driver"], entry["pool"], entry["device"]) == (DEFAULT_DRIVER_NAME, "node-a", "gpu-5")
    assert entry["data"]["cdiDeviceIDs"] == answer["claims"][uid]["devices"][0]["cdi_device_ids"]
    assert entry["conditions"][0]["type"] == "Ready"


async def test_a_claim_unprepared_before_its_status_settles_sends_nothing(
    cluster: Cluster, short_dir: Path
) -> None:
    """The first attempt waits, so the claims of a burst of pod starts (and of pods that end at
    once) cost the API server nothing; and the agent no task: the write's task starts when the
    moment is over (a timer until then, issue 31)."""
    claim = allocated(cluster, "brief", {"device": "gpu-2"})
    puts_before = cluster.server.request_count("PUT", "resourceclaims")  # the allocation's

    async with node(cluster, short_dir, "t4x4", NodeConfig(), settle_seconds=0.5) as n:
        assert (await n.engine.prepare([claim]))[claim[2]].error == ""
        await asyncio.sleep(0.1)
        assert [task for task in asyncio.all_tasks() if task.get_name().startswith("claim-status-")] == []
        assert await n.engine.unprepare([claim]) == {claim[2]: ""}
        await asyncio.sleep(0.6)
    assert cluster.server.request_count("PUT", "resourceclaims") == puts_before
    assert n.count("dropped") == 1
    assert devices_of(cluster, "brief") == []


# --- restarts and repeated prepares: nothing is lost ----------------------------------------------


def mig_data(outcome_cdi_ids: list[str], mig_uuid: str) -> dict[str, Any]:
    """What a prepare of gpu-1-mig-1g10gb-3 on dgx-h100-mig writes (as the first test checks)."""
    gpu_1 = simulated_node("dgx-h100-mig")[1]
    return {
        "type": "mig",
        "gpuUUID": gpu_1.uuid,
        "gpuIndex": gpu_1.index,
        "migProfile": "1g.10gb",
        "migDeviceUUID": mig_uuid,
        "cdiDeviceIDs": outcome_cdi_ids,
    }


async def test_a_status_lost_to_a_restart_is_written_once_by_the_next_start(
    cluster: Cluster, short_dir: Path
) -> None:
    """The write fails until the agent stops (its pending write dies with it); the next start
    writes it from the claim's record, the same entry a prepare writes, with one PUT."""
    claim = allocated(cluster, "lost", {"device": "gpu-1-mig-1g10gb-3"})
    faults = cluster.server.faults
    faults.fail_methods = frozenset({"PUT"})
    faults.fail_status = 503
    faults.fail_next = 10**6

    async def before_restart() -> list[str]:
        async with node(cluster, short_dir, "dgx-h100-mig", DYNAMIC) as n:
            outcome = (await n.engine.prepare([claim]))[claim[2]]
            assert outcome.error == ""
            await until(lambda: n.count("failed") >= 2)
            return list(outcome.devices[0].cdi_device_ids)

    cdi_ids = await before_restart()
    assert devices_of(cluster, "lost") == []
    faults.fail_next = 0
    puts_before = cluster.server.request_count("PUT", "resourceclaims")

    async def after_restart() -> tuple[Node, str]:
        async with node(cluster, short_dir, "dgx-h100-mig", DYNAMIC) as n:
            await asyncio.wait_for(n.writer.wait_idle(), 5)
            (gpu,) = [gpu for gpu in await n.hardware.discover() if gpu.mig_instances]
            return n, gpu.mig_instances[0].uuid

    n, mig_uuid = await after_restart()
    assert cluster.server.request_count("PUT", "resourceclaims") == puts_before + 1
    assert (n.count("written"), n.count("failed")) == (1, 0)
    (entry,) = devices_of(cluster, "lost")
    assert keys([entry]) == [(DEFAULT_DRIVER_NAME, "node-a", "gpu-1-mig-1g10gb-3", None)]
    assert entry["data"] == mig_data(cdi_ids, mig_uuid)
    (condition,) = entry["conditions"]
    # The stand-in keeps no metadata.generation for claims: then no condition observes one.
    generation = stored(cluster, "lost")["metadata"].get("generation")
    assert {k: v for k, v in condition.items() if k != "lastTransitionTime"} == {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "prepared by the node agent on node-a",
        **({} if generation is None else {"observedGeneration": generation}),
    }


async def test_a_start_with_every_status_stored_writes_nothing(cluster: Cluster, short_dir: Path) -> None:
    claims = [allocated(cluster, f"kept-{i}", {"device": f"gpu-{i}"}) for i in range(3)]

    async def run(prepare: bool) -> Node:
        async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
            if prepare:
                assert all(o.error == "" for o in (await n.engine.prepare(claims)).values())
            await asyncio.wait_for(n.writer.wait_idle(), 5)
            return n

    assert (await run(prepare=True)).count("written") == 3
    written = [devices_of(cluster, f"kept-{i}") for i in range(3)]
    puts_before = cluster.server.request_count("PUT", "resourceclaims")
    gets_before = cluster.server.request_count("GET", "resourceclaims")

    n = await run(prepare=False)

    assert (n.count("unchanged"), n.count("written")) == (3, 0)
    assert cluster.server.request_count("PUT", "resourceclaims") == puts_before
    assert cluster.server.request_count("GET", "resourceclaims") == gets_before + 3
    assert [devices_of(cluster, f"kept-{i}") for i in range(3)] == written


async def test_a_repeated_prepare_writes_a_status_removed_since_and_leaves_a_stored_one(
    cluster: Cluster, short_dir: Path
) -> None:
    claim = allocated(cluster, "again", {"device": "gpu-2"})

    seen = []
    async with node(cluster, short_dir, "t4x4", NodeConfig()) as n:
        for _ in range(2):
            assert (await n.engine.prepare([claim]))[claim[2]].error == ""
            await asyncio.wait_for(n.writer.wait_idle(), 5)
            seen.append(devices_of(cluster, "again"))
        body = stored(cluster, "again")
        del body["status"]["devices"]
        cluster.claims.replace_namespaced_resource_claim_status("again", "default", body)
        assert devices_of(cluster, "again") == []
        assert (await n.engine.prepare([claim]))[claim[2]].error == ""
        await asyncio.wait_for(n.writer.wait_idle(), 5)
        seen.append(devices_of(cluster, "again"))
        first, repeated, rewritten = seen
    assert (n.count("written"), n.count("unchanged")) == (2, 1)
    assert repeated == first
    (entry,) = rewritten
    assert {k: v for k, v in entry.items() if k != "conditions"} == {
        k: v for k, v in first[0].items() if k != "conditions"
    }


async def test_a_start_with_many_prepared_claims_reads_a_few_at_a_time(
    cluster: Cluster, short_dir: Path
) -> None:
    """The burst after a restart is bounded: while the server holds each GET a second, no more
    than CONCURRENCY of them reach it; the rest follow as turns free up."""
    claims = [
        allocated(
            cluster,
            f"share-{i}",
            {
                "device": f"gpu-{i % 4}",
                "shareID": str(uuid.uuid4()),
                "consumedCapacity": {"memory": "1Gi", "cores": "5"},
            },
        )
        for i in range(4 * CONCURRENCY)
    ]

    async def prepare_all() -> None:
        async with node(cluster, short_dir, "t4x4", CAPACITY) as n:
            assert all(o.error == "" for o in (await n.engine.prepare(claims)).values())
            await asyncio.wait_for(n.writer.wait_idle(), 10)
            assert n.count("written") == len(claims)

    await prepare_all()
    faults = cluster.server.faults
    faults.answer_delay_methods = frozenset({"GET"})
    faults.answer_delay_seconds = 1.0
    gets = cluster.server.request_count("GET", "resourceclaims")

    async def restart() -> Node:
        async with node(cluster, short_dir, "t4x4", CAPACITY) as n:
            await until(lambda: cluster.server.request_count("GET", "resourceclaims") >= gets + CONCURRENCY)
            await asyncio.sleep(0.3)
            assert cluster.server.request_count("GET", "resourceclaims") == gets + CONCURRENCY
            faults.answer_delay_seconds = 0.0
            await asyncio.wait_for(n.writer.wait_idle(), 10)
            return n

    n = await restart()
    assert n.count("unchanged") == len(claims)
    assert cluster.server.request_count("GET", "resourceclaims") == gets + len(claims)


async def test_the_node_agent_restarted_writes_the_status_it_could_not_write_before(
    agent: AgentProcess, apiserver: ApiServer, claims_api: client.ResourceV1Api, kubeconfig: Path
) -> None:
    uid = allocate(claims_api, "restarted", {"gpu": "gpu-4"}, pool="node-a")
    faults = apiserver.faults
    faults.fail_methods = frozenset({"PUT"})
    faults.fail_status = 503
    faults.fail_next = 10**6

    answer = await kubelet_client.prepare(
        agent.dirs.dra_socket, "v1", [ClaimArg("default", "restarted", uid)]
    )
    agent.wait_for_log("claim status write failed; retrying")
    assert agent.terminate() == 0
    faults.fail_next = 0
    restarted = start_agent(agent.dirs, kubeconfig, env=IMAGE_ENVIRONMENT)
    try:

        def entries() -> list[dict[str, Any]]:
            claim = claims_api.read_namespaced_resource_claim("restarted", "default")
            return [claims_api.api_client.sanitize_for_serialization(d) for d in claim.status.devices or []]

        wait_until(lambda: bool(entries()))
        (entry,) = entries()
        assert (entry["driver"], entry["pool"], entry["device"]) == (DEFAULT_DRIVER_NAME, "node-a", "gpu-4")
        assert entry["data"]["cdiDeviceIDs"] == answer["claims"][uid]["devices"][0]["cdi_device_ids"]
    finally:
        restarted.terminate()
