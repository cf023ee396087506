"""Fuzzing prepare and unprepare with input from outside the process.

Two doors let untrusted data in. The claim object comes from the API server, and the stand-in
cannot serve malformed ones (it validates against the upstream schemas), so the engine runs here
in-process on a claim source that returns whatever hypothesis makes: valid claims of every device
kind with opaque configs, the same with a few random mutations (wrong types, missing and extra
fields, bad shareIDs and capacities, random configs), claims built to pass every check made
before the first side effect and fail one made after, and arbitrary JSON. Claim identities come
from kubelet over the DRA socket, so random NodePrepareResources/NodeUnprepareResources messages,
and bytes that are no message at all, go to a real agent.

Either way every claim must get its own answer, success or an error saying why (never an
exception, never "internal error"), a refused claim must leave nothing behind (no record left
"preparing", no spec without a record, no MIG instance, time slice, MPS daemon or HAMi-core
directory that no prepared record names), and the agent must keep serving.
"""

import copy
import json
import re
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.claims.edits.vgpu_edits import HamiCore
from dra_driver.claims.effect_entries import ClaimMpsEntry, GpuMpsEntry, MigInstanceEntry, TimeSliceEntry
from dra_driver.claims.engine import ClaimEngine, PrepareOutcome, RawClaim, SharingControls
from dra_driver.claims.record_codec import record_from_json
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.mps import SimulatedMps
from dra_driver.claims.sharing.sharing import gpu_daemon_key
from dra_driver.devices.node_config import GpuEntry, GpuSettings, NodeConfig
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from tests.support.agent import NODE_NAME, AgentProcess
from tests.support.claims import allocate
from tests.support.engines import simulated_engine, simulated_hardware
from tests.support.nodes import simulated_node

DRIVER = DEFAULT_DRIVER_NAME
CONFIG_API = "resource.dra-driver.dev/v1alpha1"
PROFILE = "mixed"
# Every kind of device on one node: static MIG on GPUs 0-1 (as the profile has them), dynamic MIG
# on 2-3, vGPUs in capacity mode on 4-5 (gpu-4's enforced through its MPS daemon, gpu-5's by
# HAMi-core), whole GPUs on 6-7.
DYNAMIC = GpuSettings(mode="mig-dynamic")
CAPACITY = GpuSettings(mode="vgpu-capacity")
HAMI_CORE_CAPACITY = GpuSettings(mode="vgpu-capacity", enforcement="hami-core")
NODE_CONFIG = NodeConfig(
    gpus=tuple(
        GpuEntry(where=f"gpus[{index}]", index=index, uuid=None, settings=settings)
        for index, settings in ((2, DYNAMIC), (3, DYNAMIC), (4, CAPACITY), (5, HAMI_CORE_CAPACITY))
    )
)
GPUS = simulated_node(PROFILE)
DYNAMIC_GPUS = {GPUS[2].uuid, GPUS[3].uuid}
VGPUS = {"gpu-4", "gpu-5"}
HAMI_CORE_VGPU = "gpu-5"  # the other's shares go through gpu-4's MPS daemon: no HAMi-core directory

# -- claim objects --------------------------------------------------------------------------------

JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)
# Strings that sit just beside valid values, where a lax check would let them through.
NEAR_MISSES = st.sampled_from(
    [
        "",
        " ",
        "gpu-6 ",
        "GPU-6",
        "gpu-6\n",
        "../gpu-6",
        "gpu-6/../gpu-7",
        "gpu-99",
        "gpu-2-mig-1g10gb-99",
        "node-b",
        DRIVER.upper(),
        "\x00",
        "é",
        "x" * 300,
        "0",
        "-1Gi",
        "1.5Gi",
        "0.5Mi",
        "1e3",
        "100m",
        "81Gi",
        "9" * 40,
        "101",
        "3F9C1E52-7A4B-4D2E-9B61-0C8D5E2F4A17",
        "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a1",
        "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17\n",
    ]
)
ANY_VALUE = st.one_of(JSON, NEAR_MISSES)
# Field names the engine reads, so added fields land where they matter as often as not.
KNOWN_KEYS = st.sampled_from(
    [
        "metadata",
        "uid",
        "status",
        "allocation",
        "devices",
        "results",
        "config",
        "request",
        "driver",
        "pool",
        "device",
        "adminAccess",
        "shareID",
        "consumedCapacity",
        "memory",
        "cores",
        "source",
        "requests",
        "opaque",
        "parameters",
        "apiVersion",
        "kind",
        "sharing",
        "strategy",
        "mps",
        "timeSlicing",
        "memoryOversubscription",
        "coreLimitPolicy",
        "taskPriority",
        "oomKiller",
    ]
)
SHARE_IDS = st.uuids().map(str)
QUANTITIES = st.fixed_dictionaries(
    {},
    optional={
        "memory": st.sampled_from(["1Mi", "4Gi", "80Gi"]),
        "cores": st.sampled_from(["1", "25", "100"]),
    },
)
# One allocation result of each kind the node offers (request, driver and pool are added later).
RESULTS: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.sampled_from(["gpu-6", "gpu-7"]).map(lambda device: {"device": device}),
    st.sampled_from(["gpu-0-mig-1g10gb-2", "gpu-0-mig-3g40gb-4", "gpu-1-mig-2g20gb-0"]).map(
        lambda device: {"device": device}
    ),
    st.sampled_from(
        ["gpu-2-mig-1g10gb-3", "gpu-2-mig-3g40gb-4", "gpu-3-mig-7g80gb-0", "gpu-3-mig-1g10gb-5"]
    ).map(lambda device: {"device": device}),
    st.builds(
        lambda device, share, consumed: {"device": device, "shareID": share, "consumedCapacity": consumed},
        st.sampled_from(["gpu-4", "gpu-5"]),
        SHARE_IDS,
        QUANTITIES,
    ),
    st.sampled_from(["gpu-6", "gpu-2-mig-1g10gb-3", "gpu-4"]).map(
        lambda device: {"device": device, "adminAccess": True}
    ),
)
MPS_SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "defaultActiveThreadPercentage": st.integers(1, 100),
        "defaultPinnedDeviceMemoryLimit": st.sampled_from(["512Mi", "1Gi"]),
        "defaultPerDevicePinnedMemoryLimit": st.dictionaries(
            st.sampled_from(["0", "1", GPUS[6].uuid]), st.sampled_from(["256Mi", "2Gi"]), max_size=2
        ),
    },
)
TIME_SLICING = st.sampled_from(["Default", "Short", "Medium", "Long"]).map(
    lambda interval: {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}
)
MPS = MPS_SETTINGS.map(lambda mps: {"strategy": "MPS", "mps": mps})
VGPU_KNOBS = st.fixed_dictionaries(
    {},
    optional={
        "memoryOversubscription": st.booleans(),
        "coreLimitPolicy": st.sampled_from(["Default", "Force", "Disable"]),
        "taskPriority": st.integers(0, 1),
        "oomKiller": st.booleans(),
    },
)
# Valid parameters of the kind that fits each device type (the same kind for every device of a
# type in one claim is what HAMi-core needs; the engine must refuse anything else itself).
FITTING_PARAMETERS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "gpu": st.one_of(TIME_SLICING, MPS).map(lambda sharing: {"kind": "GpuConfig", "sharing": sharing}),
    "mig": st.one_of(st.just({"strategy": "TimeSlicing"}), MPS).map(
        lambda sharing: {"kind": "MigDeviceConfig", "sharing": sharing}
    ),
    "vgpu": VGPU_KNOBS.map(lambda knobs: {"kind": "VgpuConfig", **knobs}),
}


def device_type(device: str) -> str:
    return "mig" if "-mig-" in device else "vgpu" if device in VGPUS else "gpu"


@st.composite
def valid_claims(draw: st.DrawFn) -> dict[str, Any]:
    """An allocated claim as the API server would serve it (metadata.uid is filled in later),
    with opaque configs mostly of the kind that fits the devices they name."""
    results = [
        {
            "request": f"r{i}",
            "driver": draw(st.sampled_from([DRIVER, DRIVER, DRIVER, "net.example.com"])),
            "pool": NODE_NAME,
            **result,
        }
        for i, result in enumerate(draw(st.lists(RESULTS, min_size=1, max_size=3)))
    ]
    configs = []
    for _ in range(draw(st.integers(0, 2))):
        target = draw(st.sampled_from(results))
        fitting = FITTING_PARAMETERS[device_type(target["device"])]
        parameters = draw(st.one_of(fitting, fitting, fitting, *FITTING_PARAMETERS.values(), JSON))
        configs.append(
            {
                "source": draw(st.sampled_from(["FromClass", "FromClaim"])),
                "requests": draw(st.sampled_from([[target["request"]], [target["request"]], []])),
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {"apiVersion": CONFIG_API, **parameters}
                    if isinstance(parameters, dict) and "kind" in parameters
                    else parameters,
                },
            }
        )
    return claim_document(results, configs)


def claim_document(results: list[dict[str, Any]], configs: list[dict[str, Any]]) -> dict[str, Any]:
    """An allocated claim as the API server serves it; metadata.name and uid are filled in by
    FuzzedClaims.add."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": "", "uid": ""},
        "spec": {
            "devices": {
                "requests": [
                    {"name": result["request"], "exactly": {"deviceClassName": "gpu.dra-driver.dev"}}
                    for result in results
                ]
            }
        },
        "status": {"allocation": {"devices": {"results": results, "config": configs}}},
    }


# What only the checks after the first side effects refuse: vGPU shares are checked after MIG
# instances are created and sharing is set up, and a second instance can overlap the first.
LATE_FAILURES: st.SearchStrategy[list[dict[str, Any]]] = st.one_of(
    st.builds(
        lambda share, consumed: [{"device": "gpu-4", "shareID": share, "consumedCapacity": consumed}],
        SHARE_IDS,
        st.dictionaries(
            st.sampled_from(["memory", "cores", "bogus"]),
            NEAR_MISSES | st.sampled_from(["0", "101", "81Gi", "4Gi", "25"]),
            min_size=1,
            max_size=2,
        ),
    ),
    st.builds(
        lambda a, b: [{"device": "gpu-4", "shareID": a}, {"device": "gpu-4", "shareID": b}],
        SHARE_IDS,
        SHARE_IDS,
    ),
    st.just([{"device": "gpu-2-mig-7g80gb-0"}]),
    st.just([]),
)
# Sharing for the claim's whole GPU and MIG devices: set up before the late checks, and also
# refused late itself (an MPS key naming no device, MPS on some devices only).
LATE_SHARING: dict[str, dict[str, dict[str, Any]]] = {
    "timeslicing": {"gpu": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}},
    "mps": {
        "gpu": {"strategy": "MPS"},
        "mig": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}},
    },
    "mps-bad-key": {
        kind: {"strategy": "MPS", "mps": {"defaultPerDevicePinnedMemoryLimit": {"7": "1Gi"}}}
        for kind in ("gpu", "mig")
    },
    "mps-on-mig-only": {"mig": {"strategy": "MPS"}},
}


@st.composite
def claims_failing_late(draw: st.DrawFn) -> dict[str, Any]:
    """Claims built to pass every check made before side effects start (a dynamic MIG instance,
    maybe a whole GPU's time slice or an MPS daemon) and often to fail one made after: the engine
    must undo what it did."""
    devices = [
        {"device": draw(st.sampled_from(["gpu-2-mig-1g10gb-3", "gpu-2-mig-2g20gb-0", "gpu-3-mig-3g40gb-4"]))}
    ]
    if draw(st.booleans()):
        devices.append({"device": "gpu-6"})
    devices = draw(st.permutations(devices + draw(LATE_FAILURES)))
    results = [
        {"request": f"r{i}", "driver": DRIVER, "pool": NODE_NAME, **device}
        for i, device in enumerate(devices)
    ]
    sharing_of_type = LATE_SHARING.get(draw(st.sampled_from(["none", *LATE_SHARING])), {})
    configs = []
    for result in results:
        kind = device_type(result["device"])
        if kind in sharing_of_type:
            parameters = {
                "apiVersion": CONFIG_API,
                "kind": "GpuConfig" if kind == "gpu" else "MigDeviceConfig",
                "sharing": sharing_of_type[kind],
            }
            configs.append(
                {
                    "source": "FromClaim",
                    "requests": [result["request"]],
                    "opaque": {"driver": DRIVER, "parameters": parameters},
                }
            )
    return claim_document(results, configs)


JsonPath = tuple[str | int, ...]


def paths(node: object, prefix: JsonPath = ()) -> list[JsonPath]:
    """Every place in a JSON tree, the root included."""
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += paths(child, (*prefix, index))
    return found


def get(node: Any, path: JsonPath) -> Any:
    for step in path:
        node = node[step]
    return node


@st.composite
def mutated(draw: st.DrawFn, claim: dict[str, Any]) -> Any:
    """`claim` after 1-3 random edits: a value replaced (by any JSON, a near miss, or itself in a
    list), a field or element removed, a field added."""
    document: Any = copy.deepcopy(claim)
    for _ in range(draw(st.integers(1, 3))):
        # Mostly below status, where the engine reads the most; the root now and then, which
        # replaces the whole object.
        candidates = paths(document)
        in_status = [path for path in candidates if path[:1] == ("status",)] or candidates
        path = draw(st.sampled_from(draw(st.sampled_from([candidates, in_status, in_status, in_status]))))
        operation = draw(st.sampled_from(["replace", "replace", "wrap", "delete", "add"]))
        parent = get(document, path[:-1]) if path else None
        if operation == "add":
            target = get(document, path)
            if isinstance(target, dict):
                target[draw(KNOWN_KEYS | st.text(max_size=8))] = draw(ANY_VALUE)
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), draw(ANY_VALUE))
            continue
        if parent is None:
            document = draw(ANY_VALUE) if operation != "wrap" else [document]
            continue
        if operation == "delete":
            del parent[path[-1]]
        elif operation == "wrap":
            parent[path[-1]] = [parent[path[-1]]]
        else:
            parent[path[-1]] = draw(ANY_VALUE)
    return document


@st.composite
def claim_objects(draw: st.DrawFn) -> Any:
    """Valid claims, mutated ones, ones built to fail late, and now and then arbitrary JSON (which
    rarely gets past the first check)."""
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "late", "late", "json"]))
    if kind == "json":
        return draw(JSON)
    if kind == "late":
        return draw(claims_failing_late())
    valid = draw(valid_claims())
    return valid if kind == "valid" else draw(mutated(valid))


class FuzzedClaims:
    """The claim source: whatever JSON hypothesis made, keyed by name as the API server would."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}

    def add(self, name: str, document: Any) -> RawClaim:
        uid = str(uuid.UUID(int=len(self.objects) + 1, version=4))
        # The metadata kubelet's identity must match, where the fuzzed object kept it.
        metadata = document.get("metadata") if isinstance(document, dict) else None
        if isinstance(metadata, dict):
            metadata.update(
                {key: value for key, value in (("name", name), ("uid", uid)) if metadata.get(key) == ""}
            )
        self.objects[name] = document
        return RawClaim("default", name, uid)

    async def get(self, namespace: str, name: str) -> object:
        return self.objects[name]


def read_records(state: Path) -> dict[str, ClaimRecord]:
    directory = state / "claims"
    return {
        path.stem: record_from_json(json.loads(path.read_bytes()))
        for path in (directory.glob("*.json") if directory.exists() else ())
    }


def spec_uids(cdi: Path) -> set[str]:
    prefix = f"k8s.{DRIVER}-claim_"
    return (
        {p.name.removeprefix(prefix).removesuffix(".json") for p in cdi.glob(f"{prefix}*.json")}
        if cdi.exists()
        else set()
    )


async def instances_by_gpu(hardware: SimulatedBackend) -> dict[str, Counter[tuple[int, int, int]]]:
    return {
        gpu.uuid: Counter(
            (instance.profile_id, instance.placement.start, instance.placement.size)
            for instance in gpu.mig_instances
        )
        for gpu in await hardware.discover()
    }


@dataclass
class FuzzNode:
    """An engine on the simulated node with every side effect a claim can have: MIG instances,
    time slices, MPS daemons (real processes) and HAMi-core claim directories."""

    root: Path
    hardware: SimulatedBackend
    time_slicer: SimulatedTimeSlicer
    mps: SimulatedMps
    engine: ClaimEngine

    @classmethod
    def start(cls, root: Path, source: FuzzedClaims) -> "FuzzNode":
        hardware = simulated_hardware(root, PROFILE, NODE_NAME)
        time_slicer = SimulatedTimeSlicer(gpu.uuid for gpu in GPUS)
        mps = SimulatedMps(root / "mps")
        engine = simulated_engine(
            root,
            source,
            PROFILE,
            NODE_CONFIG,
            pool=NODE_NAME,
            hardware=hardware,
            sharing=SharingControls(time_slicer, mps),
            hami_core=HamiCore(PurePosixPath(root / "libvgpu.so"), PurePosixPath(root / "hami")),
        )
        return cls(root, hardware, time_slicer, mps, engine)

    async def static_instances(self) -> dict[str, Counter[tuple[int, int, int]]]:
        return {
            gpu: n for gpu, n in (await instances_by_gpu(self.hardware)).items() if gpu not in DYNAMIC_GPUS
        }

    async def check_nothing_half_written(
        self, static: dict[str, Counter[tuple[int, int, int]]]
    ) -> dict[str, ClaimRecord]:
        """Records are all "prepared", each with its spec and no spec without one; every side
        effect on the node belongs to a record that names it: the dynamic GPUs hold exactly the
        instances the records name, once each, MPS daemons run for exactly the records that say
        so, only their GPUs have a time slice other than Default, and HAMi-core claim directories
        exist for exactly the records with a vGPU share. The static GPUs' instances are intact."""
        records = read_records(self.root / "state")
        for uid, record in records.items():
            assert record.state == "prepared", record
            assert record.claim.uid == uid
        assert spec_uids(self.root / "cdi") == set(records)
        named: dict[str, Counter[tuple[int, int, int]]] = {gpu: Counter() for gpu in DYNAMIC_GPUS}
        for record in records.values():
            for instance in record.entries(MigInstanceEntry):
                named[instance.gpu_uuid][
                    (instance.profile_id, instance.placement_start, instance.placement_size)
                ] += 1
        held = await instances_by_gpu(self.hardware)
        assert {gpu: held[gpu] for gpu in DYNAMIC_GPUS} == named
        assert all(count == 1 for counter in named.values() for count in counter.values()), named
        assert await self.static_instances() == static

        with_mps = {uid for uid, record in records.items() if record.entries(ClaimMpsEntry)}
        gpus = {
            gpu_daemon_key(gpu)
            for record in records.values()
            for gpu in (e.gpu_uuid for e in record.entries(GpuMpsEntry))
        }
        assert self.mps.claim_uids() == with_mps | gpus, "daemons of claims and GPUs in step with the records"
        assert all([await self.mps.is_running(uid) for uid in with_mps | gpus])
        sliced = {gpu.uuid for gpu in GPUS if await self.time_slicer.current(gpu.uuid) != "Default"}
        assert sliced == {
            gpu for record in records.values() for gpu in (e.gpu_uuid for e in record.entries(TimeSliceEntry))
        }
        hami_claims = self.root / "hami" / "claims"
        with_shares = {
            uid
            for uid, record in records.items()
            if any(d.device == HAMI_CORE_VGPU and d.exclusive_key for d in record.devices)
        }
        present = {path.name for path in hami_claims.iterdir()} if hami_claims.exists() else set()
        assert present == with_shares
        return records

    async def stop_daemons(self) -> None:
        """After a failed example: no daemon outlives the test."""
        for uid in self.mps.claim_uids():
            await self.mps.stop(uid)


def check_outcome(outcome: PrepareOutcome | str) -> None:
    error = outcome if isinstance(outcome, str) else outcome.error
    assert isinstance(error, str)
    assert not error.startswith("internal error"), error


@settings(max_examples=40, deadline=None)
@given(documents=st.lists(claim_objects(), min_size=1, max_size=4))
async def test_any_claim_object_is_prepared_or_refused_without_leaving_anything_behind(
    documents: list[Any],
) -> None:
    source = FuzzedClaims()
    claims = [source.add(f"claim-{i}", document) for i, document in enumerate(documents)]
    root = Path(tempfile.mkdtemp(prefix="dra-fuzz-"))
    node = FuzzNode.start(root, source)

    try:
        engine = node.engine
        await engine.load_state()
        static = await node.static_instances()

        outcomes = await engine.prepare(claims)

        assert set(outcomes) == {uid for _, _, uid in claims}
        for outcome in outcomes.values():
            check_outcome(outcome)
        records = await node.check_nothing_half_written(static)
        for uid, outcome in outcomes.items():
            if outcome.error or not outcome.devices:
                assert uid not in records, "a refused claim, or one with nothing of ours, leaves no record"
            else:
                assert records[uid].devices == outcome.devices
        # The same call again (kubelet's retry) gives the same answers for the prepared claims.
        again = await engine.prepare(claims)
        assert {u: o for u, o in again.items() if not o.error} == {
            u: o for u, o in outcomes.items() if not o.error
        }

        unprepared = await engine.unprepare(claims)

        assert unprepared == {uid: "" for _, _, uid in claims}
        assert await node.check_nothing_half_written(static) == {}
        assert engine.prepared_claims == {}
    finally:
        await node.stop_daemons()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_per_device_mps_key_too_long_to_be_a_number_is_a_config_error(short_dir: Path) -> None:
    """Found by fuzzing: a key of 5000 digits once reached int() and failed past Python's
    4300-digit limit as an internal error; an index has at most three digits."""
    key = "1" + "0" * 5000
    parameters = {
        "apiVersion": CONFIG_API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps": {"defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}}},
    }
    claim = {
        "metadata": {"namespace": "default", "name": "", "uid": ""},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-6"}],
                    "config": [
                        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}
                    ],
                }
            }
        },
    }
    source = FuzzedClaims()
    raw = source.add("big-key", claim)
    node = FuzzNode.start(short_dir, source)  # the MPS socket path must stay under 108 bytes

    async def prepare() -> str:
        await node.engine.load_state()
        static = await node.static_instances()
        error = (await node.engine.prepare([raw]))[raw[2]].error
        assert await node.check_nothing_half_written(static) == {}
        return error

    error = await prepare()

    check_outcome(error)
    assert "defaultPerDevicePinnedMemoryLimit" in error, error


# -- claim identities over the socket -------------------------------------------------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def valid_identity(namespace: str, name: str, uid: str) -> bool:
    """What Kubernetes itself can produce: the agent must refuse anything else before touching a file."""
    return bool(
        len(namespace) <= 63
        and _DNS_LABEL.fullmatch(namespace)
        and len(name) <= 253
        and _DNS_SUBDOMAIN.fullmatch(name)
        and _UID.fullmatch(uid)
    )


ODD_NAMES = st.sampled_from(
    [
        "",
        ".",
        "..",
        "../..",
        "../../etc/passwd",
        "/",
        "a/b",
        "default\x00",
        "\x00",
        "default/../x",
        "名前",
        "déjà",
        "a" * 64,
        "n" * 300,
        "-a",
        "a-",
        "A",
    ]
)
VALID_NAMES = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")
NAMES = st.one_of(
    VALID_NAMES,
    VALID_NAMES,
    ODD_NAMES,
    st.text(max_size=30),
    st.integers(1000, 70_000).map(lambda n: "n" * n),
)
UIDS = st.one_of(
    st.uuids().map(str),
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: "../" + str(u)),
    st.uuids().map(lambda u: str(u) + "\n"),
    ODD_NAMES,
    st.text(max_size=40),
)
IDENTITIES = st.tuples(st.one_of(st.just("default"), NAMES), NAMES, UIDS)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix != ".log"}


def test_any_claim_identity_gets_its_own_answer_and_the_agent_keeps_serving(
    agent: AgentProcess, claims_api: client.ResourceV1Api, short_dir: Path
) -> None:
    uid = allocate(claims_api, "real", {"gpu": "gpu-3"}, pool=NODE_NAME)
    real = ("default", "real", uid)
    before = files_under(short_dir)
    channel = grpc.insecure_channel(f"unix://{agent.dirs.dra_socket}")
    stubs = {
        "v1": (v1_pb2, v1_grpc.DRAPluginStub(channel)),
        "v1beta1": (v1beta1_pb2, v1beta1_grpc.DRAPluginStub(channel)),
    }

    def call(api: str, prepare: bool, claims: Sequence[tuple[str, str, str]]) -> dict[str, str]:
        pb2, stub = stubs[api]
        wire = [pb2.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
        if prepare:
            answer = stub.NodePrepareResources(pb2.NodePrepareResourcesRequest(claims=wire), timeout=45)
        else:
            answer = stub.NodeUnprepareResources(pb2.NodeUnprepareResourcesRequest(claims=wire), timeout=45)
        return {key: value.error for key, value in answer.claims.items()}

    @settings(max_examples=50, deadline=None)
    @given(
        api=st.sampled_from(["v1", "v1beta1"]),
        prepare=st.booleans(),
        claims=st.lists(st.one_of(IDENTITIES, st.just(real)), max_size=5, unique_by=lambda claim: claim[2]),
    )
    def one_call(api: str, prepare: bool, claims: list[tuple[str, str, str]]) -> None:
        errors = call(api, prepare, claims)

        assert set(errors) == {claim_uid for _, _, claim_uid in claims}
        for namespace, name, claim_uid in claims:
            error = errors[claim_uid]
            check_outcome(error)
            if not valid_identity(namespace, name, claim_uid):
                assert error.startswith("invalid claim identity: "), (namespace, name, claim_uid, error)
                assert len(error) < 1000, "untrusted input is cut short in messages"
            elif not prepare or (namespace, name, claim_uid) == real:
                assert error == "", error
            elif (namespace, name) != real[:2]:
                assert (
                    error == f"GET resourceclaims {namespace}/{name}: not found (deleted, or never created)"
                )
            else:
                assert "the claim was deleted and re-created" in error

    try:
        one_call()
        # Still serving, and nothing was written but the real claim's record, spec and metadata file.
        assert call("v1", True, [real]) == {uid: ""}
        assert files_under(short_dir) - before == {
            f"node/plugins/{DRIVER}/claims/{uid}.json",
            f"node/cdi/k8s.{DRIVER}-claim_{uid}.json",
            f"node/plugins/{DRIVER}/dra-device-metadata/{uid}_gpu.json",
        }
        assert call("v1beta1", False, [real]) == {uid: ""}
    finally:
        channel.close()
    assert agent.process.poll() is None
    assert not [event for event in agent.log_events() if event.endswith("failed unexpectedly")]


METHODS = [
    f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}"
    for version in ("v1", "v1beta1")
    for method in ("NodePrepareResources", "NodeUnprepareResources")
]
VALID_REQUEST = v1_pb2.NodePrepareResourcesRequest(
    claims=[v1_pb2.Claim(namespace="default", name="real", uid=str(uuid.uuid4()))]
).SerializeToString()


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes, or a valid request with a few bytes changed (mostly still well-framed)."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    data = bytearray(VALID_REQUEST)
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def test_undecodable_requests_fail_alone_and_the_agent_keeps_serving(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    """What is no DRA message at all is refused by gRPC with a status for that call alone; a message
    that happens to decode (protobuf is lenient: unknown fields are skipped) is answered claim by
    claim like any other."""
    uid = allocate(claims_api, "real", {"gpu": "gpu-3"}, pool=NODE_NAME)
    channel = grpc.insecure_channel(f"unix://{agent.dirs.dra_socket}")
    # No serializers: the bytes go out as they are, and the answer comes back as bytes.
    raw: dict[str, grpc.UnaryUnaryMultiCallable[bytes, bytes]] = {
        method: channel.unary_unary(method) for method in METHODS
    }

    @settings(max_examples=50, deadline=None)
    @given(method=st.sampled_from(METHODS), data=request_bytes())
    def one_call(method: str, data: bytes) -> None:
        try:
            request = v1_pb2.NodePrepareResourcesRequest.FromString(data)
        except DecodeError:
            request = None
        try:
            answer = raw[method](data, timeout=45)
        except grpc.RpcError as error:
            # grpc.aio answers a request it cannot decode with UNKNOWN ("Unexpected DecodeError").
            assert request is None, f"a decodable request was refused: {error}"
            assert error.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), error
            return
        assert request is not None, "an undecodable request was answered"
        response_type = (
            v1_pb2.NodePrepareResourcesResponse
            if method.endswith("NodePrepareResources")
            else v1_pb2.NodeUnprepareResourcesResponse
        )
        # v1 and v1beta1 messages have the same fields, so v1 decodes both.
        answered = response_type.FromString(answer)
        assert set(answered.claims) == {claim.uid for claim in request.claims}
        for entry in answered.claims.values():
            check_outcome(entry.error)

    try:
        one_call()
        stub = v1_grpc.DRAPluginStub(channel)
        claim = v1_pb2.Claim(namespace="default", name="real", uid=uid)
        answer = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
        assert answer.claims[uid].error == ""
        assert [device.device_name for device in answer.claims[uid].devices] == ["gpu-3"]
    finally:
        channel.close()
    assert agent.process.poll() is None
    assert not [event for event in agent.log_events() if event.endswith("failed unexpectedly")]
