"""Crash safety of prepare and unprepare: the agent is killed with SIGKILL at every step that
leaves a side effect behind (dra_driver.state.failpoints), restarted, and the node must come out whole.

After every crash and restart:
- no leaked MIG instance, CDI file or device metadata file: the GPUs hold exactly the instances
  prepared claims own, and the CDI directory and the metadata directory hold the specs and files
  of prepared claims and nothing else;
- no half-prepared claim and no lost one: a claim whose prepare was cut short is either prepared
  (record, spec, metadata files and instances) or gone without a trace, and a claim nobody
  touched stays prepared;
- prepare afterwards gives the answer a crash-free prepare gives, and the same answer again;
- unprepare afterwards completes and leaves nothing of the claim behind.

Before each restart the test also checks that the crash left the debris its point's name says
(a "preparing" record, an instance no prepared claim owns, a spec without its record): without
that check, the invariants after the restart would hold just as well if the agent were never
killed, or were killed where nothing needs undoing.

MIG devices only, since they are the side effects a crash can strand (the MPS daemons of vGPU
shares, which MIG claims never pass, have a campaign of their own: test_gpu_mps_crash_safety.py).
Each claim takes its devices from different GPUs, so the devices of two claims never overlap and
every allocation is valid.
"""

import random
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.edits.cdi import claim_spec_file_name
from dra_driver.state import failpoints
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg, KubeletClientError
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate_results
from tests.support.crash import MigKey, NodeSnapshot, snapshot
from tests.support.nodes import inventory_for

HARDWARE = "simulated:dgx-h100-mig"
POOL = "node-a"
KIND = f"k8s.{DEFAULT_DRIVER_NAME}/claim"
# Points passed once per MIG instance of the claim; the others are passed once per claim.
PER_INSTANCE_POINTS = frozenset({"prepare.mig-created", "unprepare.mig-destroyed"})
INVENTORY = inventory_for("dgx-h100-mig", "mig-dynamic")


def _mig_devices_by_gpu() -> dict[int, list[str]]:
    by_gpu: dict[int, list[str]] = {}
    for device in INVENTORY.devices:
        if device.type == "mig":
            by_gpu.setdefault(INVENTORY.gpu_of_device[device.name].index, []).append(device.name)
    return by_gpu


MIG_DEVICES_BY_GPU = _mig_devices_by_gpu()
MPS_CONFIG = [
    {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": DEFAULT_DRIVER_NAME,
            "parameters": {
                "apiVersion": "resource.dra-driver.dev/v1alpha1",
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}},
            },
        },
    }
]


def instance_of(device_name: str) -> MigKey:
    """The MIG instance preparing the device creates, as the hardware state file names it."""
    attributes = INVENTORY.device_by_name[device_name].attributes
    profile_id, start, size = (attributes[key] for key in ("profileId", "placementStart", "placementSize"))
    assert isinstance(profile_id, int) and isinstance(start, int) and isinstance(size, int)
    return (INVENTORY.gpu_of_device[device_name].uuid, profile_id, start, size)


@dataclass(frozen=True, slots=True)
class Claim:
    name: str
    uid: str
    # (request, device), one per request, in request order.
    devices: tuple[tuple[str, str], ...]
    # Whether its devices are shared through an MPS control daemon of its own (issue 26).
    mps: bool = False

    @property
    def arg(self) -> ClaimArg:
        return ClaimArg("default", self.name, self.uid)

    @property
    def instances(self) -> frozenset[MigKey]:
        return frozenset(instance_of(device) for _, device in self.devices)

    def expected_answer(self) -> dict[str, Any]:
        """What a prepare that never crashed answers, devices sorted by name (kubelet does not
        care about their order)."""
        return {
            "devices": [
                {
                    "request_names": [request],
                    "pool_name": POOL,
                    "device_name": device,
                    "cdi_device_ids": [
                        f"{KIND}={self.uid}-{device}",
                        f"{KIND}={self.uid}-{request}.metadata",
                    ]
                    + ([f"{KIND}={self.uid}-mps"] if self.mps else []),
                }
                for request, device in sorted(self.devices, key=lambda pair: pair[1])
            ],
            "error": "",
        }


def sorted_devices(answer: dict[str, Any]) -> dict[str, Any]:
    """One claim's answer with its devices in name order, to compare with `expected_answer`."""
    return {**answer, "devices": sorted(answer["devices"], key=lambda device: device["device_name"])}


def random_claims(
    rng: random.Random, api: client.ResourceV1Api, round_number: int, victim_size: int
) -> tuple[Claim, Claim]:
    """The claim the crash hits (`victim_size` MIG devices, shared through MPS) and a bystander
    (one or two), each with random devices on GPUs of its own, created and allocated in the API
    server."""
    gpus = rng.sample(sorted(MIG_DEVICES_BY_GPU), 4)
    victim_gpus = gpus[:victim_size]
    bystander_gpus = gpus[2 : 2 + rng.randint(1, 2)]

    def claim(name: str, claim_gpus: list[int], mps: bool = False) -> Claim:
        devices = tuple(
            (f"r{position}", rng.choice(MIG_DEVICES_BY_GPU[gpu])) for position, gpu in enumerate(claim_gpus)
        )
        results = [
            {"request": request, "driver": DEFAULT_DRIVER_NAME, "pool": POOL, "device": device}
            for request, device in devices
        ]
        return Claim(name, allocate_results(api, name, results, MPS_CONFIG if mps else ()), devices, mps)

    victim = claim(f"victim-{round_number}", victim_gpus, mps=True)
    return victim, claim(f"bystander-{round_number}", bystander_gpus)


class Node:
    """One simulated node whose agent the test starts, kills and restarts; its MIG instances,
    records and CDI specs outlive each agent, as on a real node."""

    def __init__(self, root: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dirs = AgentDirs(root=root / "node")
        self._kubeconfig = kubeconfig
        self._monkeypatch = monkeypatch
        self._node_config = root / "node-config.yaml"
        self._node_config.write_text("default: {mode: mig-dynamic}\n")
        self._agent: AgentProcess | None = None

    @property
    def agent(self) -> AgentProcess:
        assert self._agent is not None, "no agent was started"
        return self._agent

    def start(self, armed: str = "") -> None:
        """Starts an agent; `armed`: the DRA_DRIVER_FAILPOINTS it gets (start_agent passes on this
        process's environment, so the variable is set just for the start)."""
        assert self._agent is None or self._agent.process.poll() is not None, "an agent is still running"
        if armed:
            self._monkeypatch.setenv(failpoints.ENVIRONMENT_VARIABLE, armed)
        try:
            self._agent = start_agent(
                self.dirs,
                self._kubeconfig,
                hardware=HARDWARE,
                extra=("--node-config", str(self._node_config)),
            )
        finally:
            self._monkeypatch.delenv(failpoints.ENVIRONMENT_VARIABLE, raising=False)

    def stop(self) -> None:
        """Stops the agent with nothing in flight, to restart it armed or disarmed. SIGKILL rather
        than SIGTERM: no orderly shutdown to wait for (a third of a second, on every round), and
        a crash at rest must lose nothing either, which the restart then checks."""
        assert self.agent.terminate(signal.SIGKILL) == -signal.SIGKILL, self.agent.log_path.read_text()

    def kill(self) -> None:
        """Whatever agent still runs when the test ends, passed or failed."""
        if self._agent is not None and self._agent.process.poll() is None:
            self._agent.terminate(signal.SIGKILL)

    async def prepare(self, *claims: Claim) -> dict[str, Any]:
        answer = await kubelet_client.prepare(self.dirs.dra_socket, "v1", [c.arg for c in claims])
        claims_answer: dict[str, Any] = answer["claims"]
        return claims_answer

    async def unprepare(self, *claims: Claim) -> dict[str, Any]:
        answer = await kubelet_client.unprepare(self.dirs.dra_socket, "v1", [c.arg for c in claims])
        claims_answer: dict[str, Any] = answer["claims"]
        return claims_answer

    async def call_until_killed(self, call: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any] | None:
        """The answer of `call` if the agent survived it; None if the agent died of SIGKILL
        meanwhile, which the failed call alone does not prove."""
        try:
            answer = await call()
        except KubeletClientError:
            returncode = self.agent.process.wait(timeout=30)
            assert returncode == -signal.SIGKILL, self.agent.log_path.read_text()
            return None
        assert self.agent.process.poll() is None, self.agent.log_path.read_text()
        return answer


@pytest.fixture
def node(short_dir: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    node = Node(short_dir, kubeconfig, monkeypatch)
    yield node
    node.kill()


def times_reached(point: str, claim: Claim) -> int:
    """How often preparing or unpreparing `claim` passes `point`: whether `point@n` kills."""
    if point == "prepare.mps-started":
        return int(claim.mps)
    return len(claim.devices) if point in PER_INSTANCE_POINTS else 1


def spec_file(uid: str) -> str:
    return claim_spec_file_name(DEFAULT_DRIVER_NAME, uid)


def assert_at_rest(state: NodeSnapshot) -> None:
    """What a started agent leaves: only prepared claims, exactly their instances and specs."""
    assert {uid: state.record_state(uid) for uid in state.records} == dict.fromkeys(
        state.records, "prepared"
    ), "a prepare or unprepare cut short was not rolled back"
    assert state.mig_instances == state.owned_instances(), "MIG instances no prepared claim owns"
    assert state.cdi_files == {spec_file(uid) for uid in state.prepared_uids()}, "CDI files out of step"
    assert state.mps_daemons == dict.fromkeys(state.mps_named_by_prepared(), True), (
        "MPS daemons (or their directories) out of step with the prepared claims"
    )
    assert state.metadata_claims == state.prepared_uids(), "device metadata files out of step"


def assert_all_or_nothing(state: NodeSnapshot, claim: Claim) -> None:
    if state.record_state(claim.uid) is None:
        assert claim.uid not in state.cdi_specs, "a spec of a claim that is not prepared"
        assert claim.uid not in state.metadata_claims, "metadata files of a claim that is not prepared"
        assert not state.mig_instances & claim.instances, "an instance of a claim that is not prepared"
        assert claim.uid not in state.mps_daemons, "an MPS daemon of a claim that is not prepared"
    else:
        assert_intact(state, claim)


def assert_intact(state: NodeSnapshot, claim: Claim) -> None:
    """The claim is prepared, with all it was prepared with."""
    assert state.record_state(claim.uid) == "prepared"
    assert claim.uid in state.cdi_specs
    assert claim.uid in state.metadata_claims
    assert state.instances_named_by(claim.uid) == claim.instances
    assert claim.instances <= state.mig_instances
    assert state.mps_daemons.get(claim.uid, False) == claim.mps


def assert_left_behind(state: NodeSnapshot, point: str, times: int, victim: Claim, bystander: Claim) -> None:
    """The debris the crash at `point` (the `times`-th time it was reached) leaves: the victim's
    record state, whether its spec and its metadata files exist, and how many of its instances
    exist."""
    assert_intact(state, bystander)
    created = len(victim.instances)
    expected = {
        "prepare.preparing-recorded": ("preparing", False, False, 0),
        "prepare.mig-created": ("preparing", False, False, times),
        "prepare.mps-started": ("preparing", False, False, created),
        "prepare.metadata-written": ("preparing", False, True, created),
        "prepare.cdi-written": ("preparing", True, True, created),
        "prepare.prepared-recorded": ("prepared", True, True, created),
        "unprepare.mig-destroyed": ("preparing", True, True, created - times),
        "unprepare.record-deleted": (None, True, True, 0),
        "unprepare.cdi-removed": (None, False, True, 0),
        "unprepare.metadata-removed": (None, False, False, 0),
    }[point]
    left = state.mig_instances - bystander.instances
    assert left <= victim.instances
    left_behind = (
        state.record_state(victim.uid),
        victim.uid in state.cdi_specs,
        victim.uid in state.metadata_claims,
        len(left),
    )
    assert left_behind == expected


async def crash_during_prepare(node: Node, point: str, times: int, victim: Claim, bystander: Claim) -> None:
    # The armed agent prepares the bystander first; its passes of the point are counted in, so the
    # victim's prepare is the one cut short.
    node.start(armed=f"{point}@{times + times_reached(point, bystander)}")
    before = await node.prepare(bystander)
    assert sorted_devices(before[bystander.uid]) == bystander.expected_answer()
    answer = await node.call_until_killed(lambda: node.prepare(victim))
    if answer is None:
        assert times <= times_reached(point, victim), "killed at a point the prepare does not pass so often"
        assert_left_behind(snapshot(node.dirs), point, times, victim, bystander)
    else:
        assert times > times_reached(point, victim), f"{point}@{times} was passed but did not kill"
        assert sorted_devices(answer[victim.uid]) == victim.expected_answer()
        node.stop()

    node.start()
    restarted = snapshot(node.dirs)
    assert_at_rest(restarted)
    assert_intact(restarted, bystander)
    assert_all_or_nothing(restarted, victim)

    first = await node.prepare(victim)
    assert sorted_devices(first[victim.uid]) == victim.expected_answer()
    assert await node.prepare(victim) == first
    assert await node.prepare(bystander) == before
    prepared = snapshot(node.dirs)
    assert_at_rest(prepared)
    assert prepared.prepared_uids() == {victim.uid, bystander.uid}
    assert prepared.mig_instances == victim.instances | bystander.instances


async def crash_during_unprepare(node: Node, point: str, times: int, victim: Claim, bystander: Claim) -> None:
    # Prepare passes no unprepare point: the armed agent prepares both claims unharmed.
    node.start(armed=f"{point}@{times}")
    before = await node.prepare(victim, bystander)
    assert {uid: sorted_devices(answer) for uid, answer in before.items()} == {
        victim.uid: victim.expected_answer(),
        bystander.uid: bystander.expected_answer(),
    }
    answer = await node.call_until_killed(lambda: node.unprepare(victim))
    if answer is None:
        assert times <= times_reached(point, victim), "killed at a point the unprepare does not pass so often"
        assert_left_behind(snapshot(node.dirs), point, times, victim, bystander)
    else:
        assert times > times_reached(point, victim), f"{point}@{times} was passed but did not kill"
        assert answer == {victim.uid: {"error": ""}}
        node.stop()

    node.start()
    restarted = snapshot(node.dirs)
    assert_at_rest(restarted)
    assert_intact(restarted, bystander)

    assert await node.unprepare(victim) == {victim.uid: {"error": ""}}
    unprepared = snapshot(node.dirs)
    assert_at_rest(unprepared)
    assert victim.uid not in unprepared.records
    assert unprepared.mig_instances == bystander.instances
    assert await node.prepare(bystander) == {bystander.uid: before[bystander.uid]}
    # Its placements are free again, so preparing it anew gives the first answer.
    assert await node.prepare(victim) == {victim.uid: before[victim.uid]}


async def empty_the_node(node: Node, *claims: Claim) -> None:
    """Unprepares every claim of the round, so the next round starts on a bare node: the instances
    re-created after the crash must go like any others."""
    assert await node.unprepare(*claims) == {claim.uid: {"error": ""} for claim in claims}
    emptied = snapshot(node.dirs)
    assert emptied.records == {}
    assert emptied.cdi_files == frozenset()
    assert emptied.metadata_claims == frozenset()
    assert emptied.mig_instances == frozenset()
    node.stop()


def rounds(point: str) -> list[tuple[int, int]]:
    """(MIG devices of the victim, the pass of `point` that kills) for each round. A point passed
    once per instance gets the three cases that differ: killed between the two instances, after
    both, and never (the claim has one instance, the agent survives and must still be right). A
    point passed once per claim gets one round per victim size, each an armed and a restarted
    agent: more rounds would differ only in which random placements the claims take."""
    if point in PER_INSTANCE_POINTS:
        return [(2, 1), (2, 2), (1, 2)]
    return [(1, 1), (2, 1)]


@pytest.mark.parametrize("point", [point for point in failpoints.POINTS if "gpu-mps" not in point])
async def test_a_crash_at_any_step_leaves_the_node_whole(
    node: Node, claims_api: client.ResourceV1Api, point: str
) -> None:
    rng = random.Random(f"crash-safety {point}")
    for round_number, (victim_size, times) in enumerate(rounds(point)):
        victim, bystander = random_claims(rng, claims_api, round_number, victim_size)
        try:
            if point.startswith("prepare."):
                await crash_during_prepare(node, point, times, victim, bystander)
            else:
                await crash_during_unprepare(node, point, times, victim, bystander)
            await empty_the_node(node, victim, bystander)
        except AssertionError as error:
            error.add_note(f"round {round_number}: {point}@{times}; victim {victim}; bystander {bystander}")
            raise
