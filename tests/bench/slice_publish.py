"""Benchmark: publishing the ResourceSlices of the largest MIG node, against the issue's targets.

Node: simulated dgx-h100-mig (8x H100) with every GPU mig-dynamic, so every MIG placement is a
device: 200 devices and 8 counter sets, planned into 5 slices for Kubernetes >= 1.35.

Per run, in order:
- from empty: the controller (in-process, as tests/support/publishing.py runs it) against a fresh
  stand-in API server (tests/support/apiserver.py, in a thread of this process, so its schema
  validation shares the GIL and is part of the wall time): writes, requests by verb, wall time
  from controller start to converged;
- quiet: `--quiet-seconds` with nothing changing: writes and requests;
- one-device change (one slice differs): writes and time to converge;
- two-slice change, for contrast: the generation rule (upstream's) bumps the pool generation when
  more than one slice changes, so every slice is rewritten;
- quiet again, right after those writes, when an echo of our own writes would show;
- memory: the node agent as a real process (`dra-driver node`, the same node) against the
  stand-in as another process, VmRSS and VmHWM once its slices are published; then the RSS of
  bare processes that only import what the agent imports, to show where the memory goes.

From empty and each change are timed `--repeats` times per run (from empty with a fresh server
each time): on a shared machine one sample says little.

Run: `make bench` (or `python -m tests.bench.slice_publish --runs 2`).
"""

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog
from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.slices import SliceLayout, plan_slices, slices_to_api
from dra_driver.publish.controller import DEFAULT_SYNC_DELAY_SECONDS
from tests.bench.standin import standin_apiserver
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import DEFAULT_VERSION, ApiServer, Obj, ResourceType
from tests.support.image import IMAGE_ENVIRONMENT, compile_like_the_image
from tests.support.nodes import inventory_for
from tests.support.publishing import (
    DRIVER,
    SLICES,
    Published,
    add_node,
    json_request,
    pool_problems,
    publishing,
)

PROFILE = "dgx-h100-mig"
LAYOUT: SliceLayout = "1.35"  # what the stand-in's default version (1.36) gets
VERBS = ("GET", "WATCH", "POST", "PUT", "DELETE")
PLURALS = (SLICES, "nodes", "events")
# The event the agent logs after a sync that wrote.
PUBLISHED_EVENT = "resourceslices published"
# Generous: a miss means something is broken, not slow.
CONVERGE_TIMEOUT_SECONDS = 30.0
RSS_TARGET_MIB = 60.0
# The Kubernetes API classes the agent builds (SliceApi, the claim source). The client imports each
# API module, and the pydantic models it names, on first use: that is where its memory goes.
_API_CLASSES = (
    "from kubernetes.aio import client; c = client.ApiClient(); client.ResourceV1Api(c); client.VersionApi(c)"
)
# What the bare processes run before their RSS is read: the interpreter alone, the big dependencies
# one by one (CoreV1Api only to show what the agent saves by not using it), the agent's imports,
# and those plus the API classes it uses. The agent's imports are `dra-driver node`'s (node_process,
# which imports agent/node.py), keyed by agent/node.py's name, as in the results before the split.
IMPORT_FLOORS = {
    "python": "import sys",
    "grpc": "import grpc",
    "aiohttp": "import aiohttp",
    "pydantic": "import pydantic; pydantic.BaseModel",
    "kubernetes.aio": "import kubernetes.aio.client, kubernetes.aio.config",
    "kubernetes.aio + CoreV1Api (unused)": (
        "from kubernetes.aio import client; client.CoreV1Api(client.ApiClient())"
    ),
    "dra_driver.agent.node": "import dra_driver.agent.node_process",
    "dra_driver.agent.node + API classes": f"import dra_driver.agent.node_process; {_API_CLASSES}",
}


# -- the in-process figures ---------------------------------------------------------------------------


class TimedApiServer(ApiServer):
    """The stand-in, also adding up the time it spends validating objects against the OpenAPI
    schemas (kubernetes-validate, pure Python, ~75 ms for a slice of 64 MIG devices here): writes
    wait for it, so it is part of every converge time, yet the real API server does it in Go."""

    def __init__(self) -> None:
        super().__init__()
        self.validation_seconds = 0.0

    def _validate(self, rtype: ResourceType, obj: Obj) -> None:
        started = time.perf_counter()
        try:
            super()._validate(rtype, obj)
        finally:
            self.validation_seconds += time.perf_counter() - started

    def reset_counts(self) -> None:
        super().reset_counts()
        self.validation_seconds = 0.0


def renamed(inventory: Inventory, device_index: int, name: str) -> Inventory:
    """The inventory with one device's productName changed: a change confined to that device's slice."""
    device = inventory.devices[device_index]
    changed = replace(device, attributes={**device.attributes, "productName": name})
    devices = tuple(changed if d is device else d for d in inventory.devices)
    return replace(inventory, devices=devices, device_by_name={d.name: d for d in devices})


def slices_changed(before: Inventory, after: Inventory) -> int:
    """How many planned slices differ: shows that a scenario is the change it claims to be."""
    old = slices_to_api(plan_slices(before, LAYOUT), DRIVER, NODE_NAME)
    new = slices_to_api(plan_slices(after, LAYOUT), DRIVER, NODE_NAME)
    if len(old) != len(new):
        raise AssertionError(f"the change alters the number of slices: {len(old)} -> {len(new)}")
    return sum(1 for a, b in zip(old, new, strict=True) if a["spec"] != b["spec"])


def requests_by_verb(server: ApiServer) -> dict[str, int]:
    """Requests since the last reset_counts, as "VERB plural"; zeros left out."""
    counts = {f"{verb} {plural}": server.request_count(verb, plural) for plural in PLURALS for verb in VERBS}
    return {key: count for key, count in counts.items() if count}


def generations(server: ApiServer) -> list[int]:
    return sorted({int(s["spec"]["pool"]["generation"]) for s in server.objects(SLICES)})


async def until_converged(published: Published, server: ApiServer, inventory: Inventory) -> float:
    """Waits for the controller's own converged signal (no polling, which would compete for the GIL
    with the controller and the server), then checks the stored pool really is the plan; returns
    the perf_counter time the signal came."""
    await asyncio.wait_for(published.controller.status.converged.wait(), CONVERGE_TIMEOUT_SECONDS)
    signalled = time.perf_counter()
    if problems := pool_problems(server, inventory, published.controller.status.layout or LAYOUT):
        raise AssertionError(f"the controller said converged, but: {problems}")
    return signalled


async def quiet(server: ApiServer, seconds: float) -> dict[str, Any]:
    """What the server receives while nothing changes."""
    server.reset_counts()
    await asyncio.sleep(seconds)
    return {"seconds": seconds, "writes": server.writes(SLICES), "requests": requests_by_verb(server)}


@dataclasses.dataclass
class Pool:
    """A fresh stand-in with our Node, and the controller publishing to it since `started`."""

    server: TimedApiServer
    published: Published
    started: float
    received_before: int


@contextlib.asynccontextmanager
async def fresh_pool(inventory: Inventory, sync_delay: float) -> AsyncIterator[Pool]:
    """A new server each time, so "from empty" really starts from nothing stored; the Node is
    created and the counts reset before the clock starts, so only the controller's work counts."""
    server = TimedApiServer()
    server.start()
    try:
        add_node(server)
        server.reset_counts()
        received_before = server.requests_received
        started = time.perf_counter()
        async with publishing(server, inventory, sync_delay=sync_delay) as published:
            yield Pool(server, published, started, received_before)
    finally:
        server.stop()


async def from_empty(pool: Pool, inventory: Inventory, settle_seconds: float) -> dict[str, Any]:
    """The first publication: figures at the converged signal, request counts after a settle (the
    watch may open after the first sync, and would otherwise be missed)."""
    server = pool.server
    converged = await until_converged(pool.published, server, inventory)
    writes, validation_seconds = server.writes(SLICES), server.validation_seconds
    await asyncio.sleep(settle_seconds)
    requests = requests_by_verb(server)
    return {
        "writes": writes,
        "writes_after_settle": server.writes(SLICES),
        "converge_ms": (converged - pool.started) * 1e3,
        "of_which_stand_in_validation_ms": validation_seconds * 1e3,
        "requests": requests,
        # GET /version: the one request outside the counted resources.
        "other_requests": server.requests_received - pool.received_before - sum(requests.values()),
        "generations": generations(server),
    }


async def change(pool: Pool, before: Inventory, after: Inventory) -> dict[str, Any]:
    """Publishes `after` on a converged pool; the writes and the time until the pool equals it."""
    server = pool.server
    server.reset_counts()
    started = time.perf_counter()
    pool.published.controller.set_inventory(after)  # clears status.converged before returning
    converged = await until_converged(pool.published, server, after)
    return {
        "slices_changed_in_plan": slices_changed(before, after),
        "writes": server.writes(SLICES),
        "requests": requests_by_verb(server),
        "converge_ms": (converged - started) * 1e3,
        "of_which_stand_in_validation_ms": server.validation_seconds * 1e3,
        "generations_after": generations(server),
    }


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Repetitions of one scenario as one figure: times as p50/min/max (the machine is shared, so one
    sample says little), anything else as its value when every repetition agrees, else
    {"varied": [each value]}, which then fails any target."""
    summary: dict[str, Any] = {"repetitions": len(samples)}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        if key.endswith("_ms"):
            summary[key] = {
                "p50": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "each": [round(value, 1) for value in values],
            }
        elif key == "generations_after":
            summary[key] = values[-1]
        else:
            summary[key] = values[0] if all(value == values[0] for value in values) else {"varied": values}
    return summary


async def controller_figures(
    sync_delay: float, quiet_seconds: float, settle_seconds: float, repeats: int
) -> dict[str, Any]:
    inventory = inventory_for(PROFILE, "mig-dynamic")
    last = len(inventory.devices) - 1
    firsts: list[dict[str, Any]] = []
    one_device: list[dict[str, Any]] = []
    two_slices: list[dict[str, Any]] = []
    async with fresh_pool(inventory, sync_delay) as pool:
        firsts.append(await from_empty(pool, inventory, settle_seconds))
        quiet_after_start = await quiet(pool.server, quiet_seconds)
        current = inventory
        for repetition in range(repeats):
            changed = renamed(current, 5, f"renamed-{repetition}")
            one_device.append(await change(pool, current, changed))
            current = changed
        for repetition in range(repeats):
            changed = renamed(renamed(current, 0, f"a-{repetition}"), last, f"b-{repetition}")
            two_slices.append(await change(pool, current, changed))
            current = changed
        quiet_after_changes = await quiet(pool.server, quiet_seconds)
    for _ in range(repeats - 1):
        async with fresh_pool(inventory, sync_delay) as pool:
            firsts.append(await from_empty(pool, inventory, settle_seconds))
    return {
        "from_empty": summarize(firsts),
        "quiet_after_start": quiet_after_start,
        "one_device_change": summarize(one_device),
        "two_slice_change": summarize(two_slices),
        "quiet_after_changes": quiet_after_changes,
    }


async def warm_up(inventory: Inventory) -> None:
    """One unrecorded publication, so that run 1 does not carry this process's one-time costs (the
    client imports its API modules and builds its validators on first use; the agent pays that at
    start, which spawn_to_published_s shows), and every run measures the same thing."""
    async with fresh_pool(inventory, DEFAULT_SYNC_DELAY_SECONDS) as pool:
        await until_converged(pool.published, pool.server, inventory)


# -- the agent as a process ---------------------------------------------------------------------------


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (resident now) and VmHWM (the peak resident) of a process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss_mib": fields["VmRSS"], "hwm_mib": fields["VmHWM"]}


def import_floor(statement: str) -> dict[str, float]:
    """RSS of a fresh interpreter that has run `statement` and then waits: what those imports cost."""
    code = f"{statement}; import sys; print('ready', flush=True); sys.stdin.readline()"
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{statement!r} failed (exit {process.poll()})")
        return memory_mib(process.pid)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(10)


def agent_figures(work: Path, agent_settle_seconds: float) -> dict[str, Any]:
    kubeconfig = work / "kubeconfig"
    node_config = work / "node-config.yaml"
    node_config.write_text("default: {mode: mig-dynamic}\n")
    with standin_apiserver(kubeconfig) as url:
        json_request(
            "POST",
            f"{url}/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME}},
        )
        spawned = time.monotonic()
        agent: AgentProcess = start_agent(
            AgentDirs(root=work / "node"),
            kubeconfig,
            hardware=f"simulated:{PROFILE}",
            extra=("--node-config", str(node_config)),
            wait=False,
            env=IMAGE_ENVIRONMENT,
        )
        try:
            published = agent.wait_for_log(PUBLISHED_EVENT, timeout=CONVERGE_TIMEOUT_SECONDS)
            to_published = time.monotonic() - spawned  # within the log poll's 20 ms
            time.sleep(agent_settle_seconds)
            memory = memory_mib(agent.process.pid)
            stored = json_request("GET", f"{url}/apis/resource.k8s.io/v1/resourceslices")["items"]
        finally:
            agent.terminate()
    return {
        **memory,
        "spawn_to_published_s": to_published,
        "published_log": {key: published.get(key) for key in ("generation", "created", "updated", "deleted")},
        "slices_stored": len(stored),
        "devices_stored": sum(len(s["spec"].get("devices", [])) for s in stored),
        "import_floors": {name: import_floor(statement) for name, statement in IMPORT_FLOORS.items()},
    }


# -- targets and output -------------------------------------------------------------------------------


def targets(slices: int) -> dict[str, dict[str, Any]]:
    return {
        "from_empty_writes": {"equals": slices, "why": "one create per planned slice"},
        "one_device_change_writes": {"equals": 1, "why": "one slice changes; the generation stays"},
        "two_slice_change_writes": {
            "equals": slices,
            "why": "not an issue target: more than one changed slice bumps the pool generation "
            "(upstream's rule), which rewrites every slice",
        },
        "quiet_writes": {"equals": 0, "why": "nothing changed"},
        "agent_rss_mib": {"at_most": RSS_TARGET_MIB, "why": "node agent with the controller running"},
    }


def met(run: dict[str, Any], slices: int) -> dict[str, bool]:
    quiet_writes = run["quiet_after_start"]["writes"] + run["quiet_after_changes"]["writes"]
    return {
        "from_empty_writes": run["from_empty"]["writes"]
        == run["from_empty"]["writes_after_settle"]
        == slices,
        "one_device_change_writes": run["one_device_change"]["writes"] == 1,
        "two_slice_change_writes": run["two_slice_change"]["writes"] == slices,
        "quiet_writes": quiet_writes == 0,
        "agent_rss_mib": run["agent"]["rss_mib"] <= RSS_TARGET_MIB,
    }


def summary(run: dict[str, Any]) -> str:
    empty, one, two, agent = (
        run["from_empty"],
        run["one_device_change"],
        run["two_slice_change"],
        run["agent"],
    )
    quiet_writes = run["quiet_after_start"]["writes"] + run["quiet_after_changes"]["writes"]
    floors = agent["import_floors"]
    return " | ".join(
        [
            f"from empty {empty['writes']} writes in {empty['converge_ms']['p50']:.0f} ms (p50)",
            f"one device {one['writes']} write(s) in {one['converge_ms']['p50']:.0f} ms",
            f"two slices {two['writes']} writes in {two['converge_ms']['p50']:.0f} ms",
            f"quiet {quiet_writes} writes",
            f"agent RSS {agent['rss_mib']:.1f} MiB (peak {agent['hwm_mib']:.1f})",
            f"bare import dra_driver.agent.node {floors['dra_driver.agent.node']['rss_mib']:.1f} MiB",
            f"+ API classes {floors['dra_driver.agent.node + API classes']['rss_mib']:.1f} MiB",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2, help="repeat every figure this many times")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed scenarios per run (from empty, each change)"
    )
    parser.add_argument("--sync-delay", type=float, default=DEFAULT_SYNC_DELAY_SECONDS)
    parser.add_argument("--quiet-seconds", type=float, default=10.0)
    parser.add_argument("--settle-seconds", type=float, default=1.0, help="after converging, before counting")
    parser.add_argument("--agent-settle-seconds", type=float, default=2.0, help="published to RSS reading")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    compile_like_the_image()
    # The controller's info lines would bury the results; warnings and errors still show.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    inventory = inventory_for(PROFILE, "mig-dynamic")
    slices = len(plan_slices(inventory, LAYOUT))
    results: dict[str, Any] = {
        "node": f"simulated:{PROFILE}, every GPU mig-dynamic",
        "devices": len(inventory.devices),
        "counter_sets": len(inventory.counter_sets),
        "slices_planned": slices,
        "api_server": f"tests.support.apiserver, Kubernetes {DEFAULT_VERSION} (slice layout {LAYOUT})",
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "settings": {
            "sync_delay_s": args.sync_delay,
            "quiet_s": args.quiet_seconds,
            "settle_s": args.settle_seconds,
            "agent_settle_s": args.agent_settle_seconds,
        },
        "targets": targets(slices),
        "runs": [],
    }
    asyncio.run(warm_up(inventory))
    for number in range(args.runs):
        # The machine may be shared: the load says how much the times below can be trusted.
        load_before = os.getloadavg()[0]
        run = asyncio.run(
            controller_figures(args.sync_delay, args.quiet_seconds, args.settle_seconds, args.repeats)
        )
        with tempfile.TemporaryDirectory(prefix="dra-sp-") as temporary:
            run["agent"] = agent_figures(Path(temporary), args.agent_settle_seconds)
        run["load_average_1m"] = {"before": load_before, "after": os.getloadavg()[0]}
        run["meets_targets"] = met(run, slices)
        results["runs"].append(run)
        print(f"run {number + 1}: {summary(run)}", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
