"""Many overlapping prepare and unprepare calls over the real DRA socket, as a busy kubelet makes them.

tests/unit/claims/test_engine_concurrency.py interleaves calls inside one event loop with whole GPUs
only; here the agent is a real process behind grpc.aio, serving every kind of device at once
(whole GPUs, static and dynamic MIG, vGPU shares), and 64 calls are in flight together: repeated
claims, claims that want the same exclusive device, shares of one shareable device, dynamic MIG
devices whose placements overlap, claims whose sharing config sets a time slice or starts an MPS
daemon, and unprepares racing the prepares. What must hold:

- no exclusive device (a whole GPU, a MIG device, one share of a vGPU) is held by two claims at
  once, judged from the answers and their timing and from the records on disk;
- every claim of every call gets an answer, which is success or an error that says why (for a
  device held by another claim: that claim);
- the state on disk is never corrupt: every record parses whenever it is read, and once the calls
  are answered every record is "prepared", every CDI spec belongs to a record, every MIG
  instance the simulated GPUs hold belongs to exactly one record, and MPS daemons run for
  exactly the prepared claims that asked for one;
- after everything is unprepared nothing remains.
"""

import asyncio
import json
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.agent.gpu_platform import SIMULATED_HARDWARE_STATE
from dra_driver.claims.record_codec import record_from_json
from dra_driver.claims.sharing.sharing import gpu_daemon_key
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.tools.kubelet_client import DraApi
from tests.support.agent import NODE_NAME, AgentDirs, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate_results

CALLS_PER_WAVE = 64
# Each wave is a fresh random mix; the API server's latency differs per wave, so the claim GETs
# (which run before a claim's lock is taken) finish in different orders.
WAVES = ((1, 0.0), (2, 0.01), (3, 0.003))
CDI_KIND = f"k8s.{DEFAULT_DRIVER_NAME}/claim"
CONFIG_API = "resource.dra-driver.dev/v1alpha1"
NODE_CONFIG = """\
gpus:
  - {index: 2, mode: mig-dynamic}
  - {index: 3, mode: mig-dynamic}
  - {index: 4, mode: vgpu-capacity}
  - {index: 5, mode: vgpu-capacity, vgpu: {enforcement: none}}
"""
GPUS = simulated_gpus(NODE_NAME, resolve_node_spec("mixed"))
DYNAMIC_GPUS = {GPUS[2].uuid, GPUS[3].uuid}


def share(n: int) -> str:
    return str(uuid.UUID(int=n, version=4))


# name -> [(device, shareID or None)]. Devices of the mixed node with the node config above:
# static MIG on GPUs 0-1, dynamic MIG on 2-3, vGPUs (capacity mode) on 4-5, whole GPUs on 6-7.
# gpu-4's shares go through its MPS daemon (vgpu.enforcement mps: one daemon, started by the first
# share, stopped by the last, racing prepares and unprepares); gpu-5's are advisory, so that
# mixed-b may take a share with other devices (a share under mps must be its claim's only one).
WANTED: dict[str, list[tuple[str, str | None]]] = {
    # Three claims want gpu-6; mixed-a wants gpu-7 with whole-d.
    "whole-a": [("gpu-6", None)],
    "whole-b": [("gpu-6", None)],
    "whole-c": [("gpu-6", None)],
    "whole-d": [("gpu-7", None)],
    "static-a": [("gpu-0-mig-1g10gb-2", None)],
    "static-b": [("gpu-0-mig-1g10gb-2", None)],
    "static-c": [("gpu-1-mig-3g40gb-4", None)],
    # Two claims want one dynamic MIG device (mixed-b too); dyn-c fits beside it.
    "dyn-a": [("gpu-2-mig-1g10gb-3", None)],
    "dyn-b": [("gpu-2-mig-1g10gb-3", None)],
    "dyn-c": [("gpu-2-mig-2g20gb-0", None)],
    # Different devices whose placements overlap on GPU 3 (the scheduler's counters would prevent
    # this): whoever creates its instance first wins, the others' creation fails and is undone.
    "gpu3-big": [("gpu-3-mig-7g80gb-0", None)],
    "gpu3-small": [("gpu-3-mig-1g10gb-5", None)],
    "gpu3-pair": [("gpu-3-mig-1g10gb-0", None), ("gpu-3-mig-1g10gb-5", None)],
    "gpu3-me": [("gpu-3-mig-1g10gb-me-5", None)],
    # Four distinct shares of gpu-4 fit together; two claims name the same share of gpu-5.
    "vgpu-a": [("gpu-4", share(1))],
    "vgpu-b": [("gpu-4", share(2))],
    "vgpu-c": [("gpu-4", share(3))],
    "vgpu-d": [("gpu-4", share(4))],
    "vgpu-same-1": [("gpu-5", share(5))],
    "vgpu-same-2": [("gpu-5", share(5))],
    # Several kinds in one claim: all-or-nothing.
    "mixed-a": [("gpu-7", None), ("gpu-2-mig-1g10gb-5", None)],
    "mixed-b": [("gpu-1-mig-2g20gb-0", None), ("gpu-5", share(6)), ("gpu-2-mig-1g10gb-3", None)],
}
# Claims whose MIG creation may be refused by the GPU because another claim's instance overlaps.
OVERLAPPING = {"gpu3-big", "gpu3-small", "gpu3-pair", "gpu3-me"}
# Sharing side effects that prepare applies and unprepare undoes: a whole GPU's time slice, and
# an MPS control daemon (a real process on the simulated node) for a whole GPU or a MIG device.
SHARING: dict[str, tuple[str, dict[str, Any]]] = {
    "whole-a": ("GpuConfig", {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
    "whole-b": ("GpuConfig", {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}),
    "static-c": ("MigDeviceConfig", {"strategy": "MPS"}),
    "dyn-c": ("MigDeviceConfig", {"strategy": "MPS"}),
}


@dataclass(frozen=True)
class Claim:
    name: str
    uid: str
    devices: tuple[tuple[str, str | None], ...]

    @property
    def strategy(self) -> str | None:
        return SHARING[self.name][1]["strategy"] if self.name in SHARING else None

    @property
    def time_sliced_gpus(self) -> list[str]:
        return [GPUS[6].uuid] if self.strategy == "TimeSlicing" else []

    @property
    def mps_id(self) -> list[str]:
        """The claim-wide CDI device of the claim's MPS daemon, which every device carries."""
        return [f"{CDI_KIND}={self.uid}-mps"] if self.strategy == "MPS" else []

    @property
    def ref(self) -> str:
        return f"default/{self.name} ({self.uid})"

    @property
    def exclusive_keys(self) -> set[str]:
        """What the engine must give to one claim at a time: a device, or one share of a vGPU."""
        return {f"{device}/{share_id}" if share_id else device for device, share_id in self.devices}

    @property
    def device_names(self) -> list[str]:
        """The claim's CDI devices, one per allocated device (a vGPU share's carries the share)."""
        return [
            f"{self.uid}-{device}-{share_id}" if share_id else f"{self.uid}-{device}"
            for device, share_id in self.devices
        ]

    @property
    def metadata_names(self) -> list[str]:
        """The CDI devices that mount each request's device metadata file (one request per device)."""
        return [f"{self.uid}-r{position}.metadata" for position in range(len(self.devices))]

    @property
    def spec_devices(self) -> list[str]:
        return (
            self.device_names + self.metadata_names + ([f"{self.uid}-mps"] if self.strategy == "MPS" else [])
        )


@dataclass
class Call:
    op: Literal["prepare", "unprepare"]
    api: DraApi
    claims: tuple[Claim, ...]
    sent: float = 0.0
    answered: float = 0.0
    # uid -> (error, [(device name, cdi ids)])
    answers: dict[str, tuple[str, list[tuple[str, list[str]]]]] = field(default_factory=dict)


def allocate(api: client.ResourceV1Api, name: str, devices: Sequence[tuple[str, str | None]]) -> Claim:
    """Creates and allocates a claim with one request per device, with shareID and consumedCapacity
    for vGPU shares (which tests.support.claims.allocate cannot write)."""
    requests = [f"r{i}" for i in range(len(devices))]
    results = []
    for request, (device, share_id) in zip(requests, devices, strict=True):
        result: dict[str, Any] = {
            "request": request,
            "driver": DEFAULT_DRIVER_NAME,
            "pool": NODE_NAME,
            "device": device,
        }
        if share_id:
            result |= {"shareID": share_id, "consumedCapacity": {"memory": "8Gi", "cores": "20"}}
        results.append(result)
    configs = []
    if name in SHARING:
        kind, sharing = SHARING[name]
        parameters = {"apiVersion": CONFIG_API, "kind": kind, "sharing": sharing}
        configs.append(
            {"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER_NAME, "parameters": parameters}}
        )
    return Claim(name, allocate_results(api, name, results, configs), tuple(devices))


def plan_wave(rng: random.Random, claims: Sequence[Claim]) -> list[Call]:
    """Mostly prepares (so claims compete), a quarter unprepares; 1-3 claims a call, repeats allowed."""
    return [
        Call(
            op="unprepare" if rng.random() < 0.25 else "prepare",
            api=rng.choice(["v1", "v1beta1"]),
            claims=tuple(rng.choice(claims) for _ in range(rng.randint(1, 3))),
        )
        for _ in range(CALLS_PER_WAVE)
    ]


async def send(channel: grpc.aio.Channel, call: Call) -> None:
    pb2, grpc_module = (v1_pb2, v1_grpc) if call.api == "v1" else (v1beta1_pb2, v1beta1_grpc)
    stub = grpc_module.DRAPluginStub(channel)
    wire = [pb2.Claim(namespace="default", name=c.name, uid=c.uid) for c in call.claims]
    call.sent = time.monotonic()
    if call.op == "prepare":
        prepared = await stub.NodePrepareResources(pb2.NodePrepareResourcesRequest(claims=wire), timeout=45)
        call.answered = time.monotonic()
        call.answers = {
            uid: (answer.error, [(d.device_name, list(d.cdi_device_ids)) for d in answer.devices])
            for uid, answer in prepared.claims.items()
        }
    else:
        unprepared = await stub.NodeUnprepareResources(
            pb2.NodeUnprepareResourcesRequest(claims=wire), timeout=45
        )
        call.answered = time.monotonic()
        call.answers = {uid: (answer.error, []) for uid, answer in unprepared.claims.items()}


def read_records(dirs: AgentDirs) -> dict[str, Any]:
    """Every record file, each checked to parse as a record; a file deleted meanwhile is skipped."""
    records = {}
    for path in (dirs.state_dir / "claims").glob("*.json"):
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            continue
        record = record_from_json(raw)  # raises on anything this code does not write
        assert path.name == f"{record.claim.uid}.json", path
        records[record.claim.uid] = raw
    return records


def dynamic_instances(dirs: AgentDirs) -> Counter[tuple[str, int, int, int]]:
    """The MIG instances the dynamic GPUs hold, from the simulated hardware's own state file."""
    path = dirs.state_dir / SIMULATED_HARDWARE_STATE
    if not path.exists():
        return Counter()
    saved = json.loads(path.read_text())["instances"]
    return Counter(
        (gpu_uuid, entry["profileId"], entry["start"], entry["size"])
        for gpu_uuid, entries in saved.items()
        if gpu_uuid in DYNAMIC_GPUS
        for entry in entries
    )


def mps_root(dirs: AgentDirs) -> Path:
    """Where tests.support.agent.start_agent points the agent's --mps-dir."""
    return dirs.root / "mps"


def mps_directories(dirs: AgentDirs) -> set[str]:
    root = mps_root(dirs)
    return {entry.name for entry in root.iterdir() if entry.is_dir()} if root.exists() else set()


def mps_daemons(dirs: AgentDirs) -> set[str]:
    """The claims whose MPS daemon runs: processes whose pipe directory is below the agent's."""
    prefix = b"CUDA_MPS_PIPE_DIRECTORY=" + bytes(mps_root(dirs)) + b"/"
    claims = set()
    for process in Path("/proc").iterdir():
        try:
            environ = (process / "environ").read_bytes() if process.name.isdigit() else b""
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for variable in environ.split(b"\0"):
            if variable.startswith(prefix):
                claims.add(variable.removeprefix(prefix).split(b"/")[0].decode())
    return claims


def claim_specs(dirs: AgentDirs) -> dict[str, Any]:
    specs = {}
    for path in dirs.cdi_dir.glob(f"k8s.{DEFAULT_DRIVER_NAME}-claim_*.json"):
        uid = path.name.removeprefix(f"k8s.{DEFAULT_DRIVER_NAME}-claim_").removesuffix(".json")
        specs[uid] = json.loads(path.read_text())
    return specs


async def watch_state(dirs: AgentDirs, stop: asyncio.Event) -> int:
    """Reads the records, CDI specs and hardware state over and over while calls are in flight:
    every write is atomic, so whatever is there must parse whenever it is read."""
    reads = 0
    while not stop.is_set():
        read_records(dirs)
        for path in dirs.cdi_dir.glob("*.json") if dirs.cdi_dir.exists() else ():
            try:
                json.loads(path.read_bytes())
            except FileNotFoundError:
                continue
        dynamic_instances(dirs)
        reads += 1
        await asyncio.sleep(0.002)
    return reads


async def run_wave(dirs: AgentDirs, calls: Sequence[Call]) -> int:
    async with grpc.aio.insecure_channel(f"unix://{dirs.dra_socket}") as channel:
        await channel.channel_ready()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_state(dirs, stop))
        try:
            await asyncio.gather(*(send(channel, call) for call in calls))
        finally:
            stop.set()
        return await watcher


HOLDER = re.compile(
    r"claim default/(?P<name>[a-z0-9-]+) \((?P<uid>[0-9a-f-]{36})\): device (?P<key>\S+) is already "
    r"prepared for claim default/(?P<holder>[a-z0-9-]+) \((?P<holder_uid>[0-9a-f-]{36})\); it is "
    r"exclusive and can serve one claim at a time"
)


def check_answers(calls: Sequence[Call], by_uid: dict[str, Claim]) -> Counter[str]:
    """Every claim of every call answered, with success or a reason; returns the kinds of refusals."""
    refusals: Counter[str] = Counter()
    for call in calls:
        assert set(call.answers) == {claim.uid for claim in call.claims}, call
        for claim in call.claims:
            error, devices = call.answers[claim.uid]
            if call.op == "unprepare" or not error:
                assert error == "", (call.op, claim.name, error)
                if call.op == "prepare":
                    assert sorted(devices) == sorted(
                        (device, [f"{CDI_KIND}={cdi_name}", f"{CDI_KIND}={metadata}", *claim.mps_id])
                        for (device, _), cdi_name, metadata in zip(
                            claim.devices, claim.device_names, claim.metadata_names, strict=True
                        )
                    )
                continue
            assert devices == [], "a refused claim gets no devices"
            if match := HOLDER.fullmatch(error):
                holder = by_uid[match["holder_uid"]]
                assert (match["name"], match["uid"]) == (claim.name, claim.uid), error
                assert match["key"] in claim.exclusive_keys & holder.exclusive_keys, error
                assert holder is not claim and match["holder"] == holder.name, error
                refusals["held by another claim"] += 1
            elif claim.name in OVERLAPPING and error.startswith(
                f"claim {claim.ref}: cannot create its MIG instance: "
            ):
                refusals["MIG placement taken"] += 1
            else:
                raise AssertionError(f"{claim.name}: unexpected error {error!r}")
    return refusals


def check_exclusive_in_time(calls: Sequence[Call]) -> None:
    """Two claims that both got the same exclusive device must have held it at different times:
    the first holder must have been unprepared by a call that overlaps the span between them.

    A successful answer means its claim held the device at some instant within the call (sent to
    answered); a release happens within an unprepare call of the holder. So if claims X and Y both
    got key K, in calls A and B, some unprepare U of X (or of Y) must have been sent before B (A)
    was answered and answered after A (B) was sent. Otherwise both held K at once."""
    successes = [
        (claim, call)
        for call in calls
        if call.op == "prepare"
        for claim in call.claims
        if call.answers[claim.uid][0] == ""
    ]
    unprepares: dict[str, list[Call]] = {}
    for call in calls:
        if call.op == "unprepare":
            for claim in call.claims:
                unprepares.setdefault(claim.uid, []).append(call)

    def released_between(holder: Claim, first: Call, second: Call) -> bool:
        return any(
            u.sent < second.answered and u.answered > first.sent for u in unprepares.get(holder.uid, [])
        )

    for i, (x, a) in enumerate(successes):
        for y, b in successes[i + 1 :]:
            if x.uid == y.uid or not x.exclusive_keys & y.exclusive_keys:
                continue
            assert released_between(x, a, b) or released_between(y, b, a), (
                f"{x.name} and {y.name} both got {sorted(x.exclusive_keys & y.exclusive_keys)} "
                "with no unprepare of either in between"
            )


def check_quiet_state(dirs: AgentDirs, by_uid: dict[str, Claim]) -> int:
    """Once every call is answered: records, specs and MIG instances agree. Returns the number of
    prepared claims."""
    records = read_records(dirs)
    assert not list((dirs.state_dir / "claims").glob(".*.tmp")), "a record write left behind"
    holders: dict[str, str] = {}
    instances: Counter[tuple[str, int, int, int]] = Counter()
    for uid, raw in records.items():
        claim = by_uid[uid]
        assert raw["state"] == "prepared", raw
        assert (raw["mps"], raw["timeSlicedGPUs"]) == (claim.strategy == "MPS", claim.time_sliced_gpus)
        assert sorted(d["device"] for d in raw["devices"]) == sorted(device for device, _ in claim.devices)
        for device in raw["devices"]:
            key = device["exclusiveKey"]
            assert key in claim.exclusive_keys, device
            assert holders.setdefault(key, claim.name) == claim.name, (
                f"{key}: {holders[key]} and {claim.name}"
            )
        instances.update(
            (i["gpuUUID"], i["profileId"], i["placementStart"], i["placementSize"])
            for i in raw["migInstances"]
        )
    specs = claim_specs(dirs)
    assert set(specs) == set(records), "every spec belongs to a record, every record has its spec"
    for uid, spec in specs.items():
        assert sorted(d["name"] for d in spec["devices"]) == sorted(by_uid[uid].spec_devices)
    # Each instance on the GPUs is one a prepared record names, and no record names one twice.
    assert max(instances.values(), default=1) == 1, instances
    assert dynamic_instances(dirs) == instances
    # A daemon, and its directories, for each MPS claim prepared and for each GPU a prepared
    # share names (gpu-4's, while any of its shares is prepared); none for anything else.
    with_mps = {uid for uid, raw in records.items() if raw["mps"]}
    gpus = {gpu_daemon_key(gpu) for raw in records.values() for gpu in raw.get("mpsGPUs", [])}
    assert mps_directories(dirs) == with_mps | gpus
    assert mps_daemons(dirs) == with_mps | gpus
    return len(records)


async def test_overlapping_calls_keep_devices_exclusive_and_state_consistent(
    apiserver: ApiServer, kubeconfig: Path, agent_dirs: AgentDirs, claims_api: client.ResourceV1Api
) -> None:
    node_config = agent_dirs.root.parent / "node-config.yaml"
    node_config.write_text(NODE_CONFIG)
    agent = start_agent(
        agent_dirs, kubeconfig, hardware="simulated:mixed", extra=("--node-config", str(node_config))
    )
    try:
        claims = [allocate(claims_api, name, devices) for name, devices in WANTED.items()]
        by_uid = {claim.uid: claim for claim in claims}
        refusals: Counter[str] = Counter()
        for seed, latency in WAVES:
            apiserver.faults.latency_seconds = latency
            calls = plan_wave(random.Random(seed), claims)

            reads = await run_wave(agent_dirs, calls)

            assert reads > 0
            refusals += check_answers(calls, by_uid)
            check_exclusive_in_time(calls)
            assert check_quiet_state(agent_dirs, by_uid) > 0

            # Everything unprepared at once, some claims twice: nothing may remain.
            cleanup = [Call("unprepare", "v1", (claim,)) for claim in claims + claims[::3]]
            await run_wave(agent_dirs, cleanup)
            assert all(call.answers == {call.claims[0].uid: ("", [])} for call in cleanup)
            assert read_records(agent_dirs) == {}
            assert claim_specs(agent_dirs) == {}
            assert dynamic_instances(agent_dirs) == Counter()
            assert mps_directories(agent_dirs) == mps_daemons(agent_dirs) == set()
        # The waves did make claims compete, and each kind of refusal happened.
        assert refusals["held by another claim"] > 0 and refusals["MIG placement taken"] > 0, refusals
        assert agent.process.poll() is None
        events = agent.log_events()
        assert "two prepared claims hold one device" not in events
        assert not [e for e in events if e.endswith("failed unexpectedly")]
    finally:
        agent.terminate()
