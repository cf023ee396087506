"""One contract for every hardware backend: what the rest of the driver may rely on.

The simulated backend always runs, and so does the NVML backend over the mock libnvidia-ml.so.1
(tests/mock_nvml), loaded from a driver root through the real nvidia-ml-py: "mock-nvml" presents
the same node as "simulated", so every difference between the two is a bug in one of them. The
NVML backend on real GPUs joins on a machine with NVIDIA GPUs when DRA_DRIVER_TEST_NVML=1, and its
MIG cases (which create and destroy real GPU instances on a GPU that has MIG mode enabled) only
when DRA_DRIVER_TEST_NVML_MIG=1 as well. The lists are fixed at collection time: a requested real
backend that is missing fails, it is never skipped.
"""

import asyncio
import os
import re
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dra_driver.hardware.backend import HardwareBackend
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.events import HealthEvent, XidEvent
from dra_driver.hardware.health_events import HealthEventSource, SimulatedEvents
from dra_driver.hardware.model import (
    Gpu,
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    MigProfile,
    Placement,
)
from dra_driver.hardware.nvml import NvmlBackend
from dra_driver.hardware.nvml_events import NvmlEvents
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import (
    DEFAULT_DRIVER_VERSION,
    SimulatedNodeSpec,
    node_profiles,
    parse_node_spec,
    resolve_node_spec,
)
from tests.support.mock_nvml import MockNode, make_driver_root

NVML = os.environ.get("DRA_DRIVER_TEST_NVML") == "1"
NVML_MIG = NVML and os.environ.get("DRA_DRIVER_TEST_NVML_MIG") == "1"
BACKENDS = ["simulated", "mock-nvml", *(["nvml"] if NVML else [])]
MIG_BACKENDS = ["simulated", "mock-nvml", *(["nvml"] if NVML_MIG else [])]
# Every GPU state at once: MIG with instances, MIG empty, MIG disabled, no MIG.
CONTRACT_PROFILE = "mixed"
CONTRACT_NODE = "contract-node"
NVML_INSUFFICIENT_RESOURCES = 23  # NVML_ERROR_INSUFFICIENT_RESOURCES (nvml.h)
# go-nvlib's architecture strings: selectors written for NVIDIA's own driver match on them.
ARCHITECTURES = {
    "Kepler",
    "Maxwell",
    "Pascal",
    "Volta",
    "Turing",
    "Ampere",
    "Ada Lovelace",
    "Hopper",
    "Blackwell",
}


@pytest.fixture(scope="session")
def mock_driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One driver root for the session: the process keeps the first libnvidia-ml.so.1 it loads."""
    return make_driver_root(tmp_path_factory.mktemp("driver-root"), DEFAULT_DRIVER_VERSION)


def open_mock_nvml(
    directory: Path, driver_root: Path, monkeypatch: pytest.MonkeyPatch, profile: str = CONTRACT_PROFILE
) -> tuple[NvmlBackend, MockNode]:
    """The NVML backend over the mock, presenting `profile` as the simulated backend would."""
    node = MockNode.create(directory, CONTRACT_NODE, profile)
    for name, value in node.environment().items():
        monkeypatch.setenv(name, value)
    return NvmlBackend(node.pci_devices, driver_root), node


def open_backend(
    kind: str, directory: Path, driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> HardwareBackend:
    if kind == "nvml":
        return NvmlBackend()
    if kind == "mock-nvml":
        return open_mock_nvml(directory, driver_root, monkeypatch)[0]
    return SimulatedBackend(CONTRACT_NODE, resolve_node_spec(CONTRACT_PROFILE))


async def refused(coroutine: Coroutine[Any, Any, object]) -> HardwareError:
    with pytest.raises(HardwareError) as raised:
        await coroutine
    return raised.value


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, mock_driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[HardwareBackend]:
    opened = open_backend(request.param, tmp_path, mock_driver_root, monkeypatch)
    yield opened
    await opened.close()


@pytest.fixture(params=MIG_BACKENDS)
async def mig_backend(
    request: pytest.FixtureRequest, tmp_path: Path, mock_driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[HardwareBackend]:
    opened = open_backend(request.param, tmp_path, mock_driver_root, monkeypatch)
    yield opened
    await opened.close()


def overlaps(placement: Placement, instances: tuple[MigInstance, ...]) -> bool:
    return any(set(placement.memory_slices) & set(other.placement.memory_slices) for other in instances)


def free_slot(gpu: Gpu) -> tuple[MigProfile, Placement]:
    """The smallest plain profile at the first placement nothing occupies: the least intrusive
    instance to create on a real GPU that may already be partly in use."""
    used = Counter(instance.profile_id for instance in gpu.mig_instances)
    for profile in sorted(gpu.mig_profiles, key=lambda p: (p.placements[0].size, p.nvml_enum)):
        if used[profile.profile_id] < profile.max_instances:
            for placement in profile.placements:
                if not overlaps(placement, gpu.mig_instances):
                    return profile, placement
    raise AssertionError(f"GPU {gpu.index} ({gpu.uuid}) has no free MIG placement; destroy an instance first")


async def mig_gpu(backend: HardwareBackend) -> Gpu:
    """The MIG-enabled GPU with the fewest instances."""
    enabled = [gpu for gpu in await backend.discover() if gpu.mig_mode is MigMode.ENABLED]
    assert enabled, f"{backend.description}: no GPU has MIG mode enabled; the MIG contract needs one"
    return min(enabled, key=lambda gpu: len(gpu.mig_instances))


async def gpu_by_uuid(backend: HardwareBackend, gpu_uuid: str) -> Gpu:
    return next(gpu for gpu in await backend.discover() if gpu.uuid == gpu_uuid)


class Created:
    """Destroys what a test created, also when the test fails: on real hardware leftovers
    would change the next run's starting point."""

    def __init__(self, backend: HardwareBackend, gpu: Gpu) -> None:
        self.backend = backend
        self.gpu = gpu
        self.instances: list[MigInstance] = []

    async def __aenter__(self) -> "Created":
        return self

    async def create(self, profile: MigProfile, placement: Placement) -> MigInstance:
        instance = await self.backend.create_mig_instance(self.gpu.uuid, profile.profile_id, placement)
        self.instances.append(instance)
        return instance

    async def __aexit__(self, *_: object) -> None:
        present = {i.gpu_instance_id for i in (await gpu_by_uuid(self.backend, self.gpu.uuid)).mig_instances}
        for instance in self.instances:
            if instance.gpu_instance_id in present:
                await self.backend.destroy_mig_instance(self.gpu.uuid, instance.gpu_instance_id)


# --- discovery ----------------------------------------------------------------------------------


async def test_discover_lists_gpus_by_index_with_unique_identities(backend: HardwareBackend) -> None:
    gpus = await backend.discover()

    assert gpus, f"{backend.description}: no GPUs"
    assert [gpu.index for gpu in gpus] == list(range(len(gpus)))
    assert len({gpu.uuid for gpu in gpus}) == len(gpus)
    assert len({gpu.pci_bus_id for gpu in gpus}) == len(gpus)
    assert len({gpu.minor for gpu in gpus}) == len(gpus)
    assert await backend.discover() == gpus


async def test_discover_reports_sane_device_facts(backend: HardwareBackend) -> None:
    for gpu in await backend.discover():
        assert gpu.uuid.startswith("GPU-"), gpu
        assert gpu.memory_bytes > 0
        assert gpu.multiprocessors > 0
        assert gpu.product_name
        assert gpu.brand
        assert gpu.architecture in ARCHITECTURES
        assert re.fullmatch(r"\d+\.\d+", gpu.cuda_compute_capability)
        assert re.fullmatch(r"\d+(\.\d+)+", gpu.driver_version)
        assert re.fullmatch(r"\d+\.\d+", gpu.cuda_driver_version)
        assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", gpu.pci_bus_id)
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", gpu.pcie_root)
        assert gpu.numa_node is None or gpu.numa_node >= 0
        assert gpu.fabric_clique is None or re.fullmatch(r"[0-9a-f-]{36}\.\d+", gpu.fabric_clique)


async def test_discover_reports_mig_state_consistently(backend: HardwareBackend) -> None:
    for gpu in await backend.discover():
        if gpu.mig_mode is MigMode.UNSUPPORTED:
            assert (gpu.memory_slices, gpu.mig_profiles) == (0, ())
        if gpu.mig_mode is not MigMode.ENABLED:
            assert gpu.mig_instances == ()
            continue
        assert gpu.memory_slices > 0
        assert gpu.mig_profiles
        pairs = [(i.gpu_instance_id, i.compute_instance_id) for i in gpu.mig_instances]
        assert pairs == sorted(set(pairs))
        placement_of_gpu_instance: dict[int, Placement] = {}
        for instance in gpu.mig_instances:
            profile = gpu.mig_profile(instance.profile_id)
            assert profile is not None, instance
            assert instance.placement in profile.placements
            # One GPU instance may be split into compute instances, or have none yet (uuid "").
            placement_of_gpu_instance.setdefault(instance.gpu_instance_id, instance.placement)
            assert placement_of_gpu_instance[instance.gpu_instance_id] == instance.placement
            if instance.compute_instance_id >= 0:
                assert instance.uuid.startswith("MIG-")
                assert 0 < instance.compute_slices <= profile.compute_slices
            else:
                assert (instance.uuid, instance.compute_slices) == ("", 0)
        placements = list(placement_of_gpu_instance.values())
        used = [index for placement in placements for index in placement.memory_slices]
        assert len(used) == len(set(used)), placements


# --- MIG ----------------------------------------------------------------------------------------


async def test_a_created_instance_appears_in_discover_where_it_was_asked_for(
    mig_backend: HardwareBackend,
) -> None:
    gpu = await mig_gpu(mig_backend)
    profile, placement = free_slot(gpu)

    async with Created(mig_backend, gpu) as created:
        instance = await created.create(profile, placement)
        after = await gpu_by_uuid(mig_backend, gpu.uuid)

    assert (instance.profile_id, instance.placement) == (profile.profile_id, placement)
    assert instance.gpu_instance_id not in {i.gpu_instance_id for i in gpu.mig_instances}
    assert (instance.compute_slices, instance.multiprocessors) == (
        profile.compute_slices,
        profile.multiprocessors,
    )
    assert after.mig_instances == tuple(
        sorted((*gpu.mig_instances, instance), key=lambda i: i.gpu_instance_id)
    )


async def test_an_overlapping_instance_is_refused_and_changes_nothing(mig_backend: HardwareBackend) -> None:
    gpu = await mig_gpu(mig_backend)
    profile, placement = free_slot(gpu)
    full_gpu = max(gpu.mig_profiles, key=lambda p: p.compute_slices)

    async with Created(mig_backend, gpu) as created:
        await created.create(profile, placement)
        before = await mig_backend.discover()
        same_place = await refused(mig_backend.create_mig_instance(gpu.uuid, profile.profile_id, placement))
        whole_gpu = await refused(
            mig_backend.create_mig_instance(gpu.uuid, full_gpu.profile_id, full_gpu.placements[0])
        )
        after = await mig_backend.discover()

    assert same_place.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES, same_place
    assert whole_gpu.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES, whole_gpu
    assert after == before


async def test_a_placement_the_profile_does_not_have_is_an_invalid_argument(
    mig_backend: HardwareBackend,
) -> None:
    gpu = await mig_gpu(mig_backend)
    profile, start = next(
        (profile, start)
        for profile in gpu.mig_profiles
        for start in range(gpu.memory_slices - profile.placements[0].size + 1)
        if Placement(start, profile.placements[0].size) not in profile.placements
    )
    before = await mig_backend.discover()

    error = await refused(
        mig_backend.create_mig_instance(
            gpu.uuid, profile.profile_id, Placement(start, profile.placements[0].size)
        )
    )

    assert error.reason is HardwareErrorReason.INVALID_ARGUMENT, error
    assert await mig_backend.discover() == before


async def test_a_destroyed_instance_is_gone(mig_backend: HardwareBackend) -> None:
    gpu = await mig_gpu(mig_backend)
    profile, placement = free_slot(gpu)

    async with Created(mig_backend, gpu) as created:
        instance = await created.create(profile, placement)
        await mig_backend.destroy_mig_instance(gpu.uuid, instance.gpu_instance_id)
        after = await gpu_by_uuid(mig_backend, gpu.uuid)

    assert after.mig_instances == gpu.mig_instances


async def test_destroying_an_unknown_instance_is_not_found(mig_backend: HardwareBackend) -> None:
    gpu = await mig_gpu(mig_backend)
    absent = max((i.gpu_instance_id for i in gpu.mig_instances), default=0) + 1

    error = await refused(mig_backend.destroy_mig_instance(gpu.uuid, absent))

    assert error.reason is HardwareErrorReason.NOT_FOUND, error
    assert await gpu_by_uuid(mig_backend, gpu.uuid) == gpu


# --- every shipped profile, faults, events: the simulated backend and NVML over the mock -------


@pytest.mark.parametrize("profile", sorted(node_profiles()))
async def test_nvml_over_the_mock_discovers_what_the_simulated_backend_does(
    profile: str, tmp_path: Path, mock_driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml, _node = open_mock_nvml(tmp_path, mock_driver_root, monkeypatch, profile)
    simulated = SimulatedBackend(CONTRACT_NODE, resolve_node_spec(profile))
    try:
        assert await nvml.discover() == await simulated.discover()
    finally:
        await nvml.close()


class Faults:
    """Faults injected the way each backend takes them: the simulated backend's hooks, or files
    the mock library reads (so the NVML backend meets them as NVML return codes)."""

    def __init__(self, backend: HardwareBackend, node: MockNode | None) -> None:
        self.backend = backend
        self.node = node

    def fail_compute_instance_creation(self) -> None:
        if self.node is None:
            assert isinstance(self.backend, SimulatedBackend)
            self.backend.fail_next("create_mig_instance", HardwareErrorReason.INSUFFICIENT_RESOURCES)
        else:
            self.node.fail_next("nvmlGpuInstanceCreateComputeInstance", NVML_INSUFFICIENT_RESOURCES)

    def lose(self, gpu: Gpu) -> None:
        if self.node is None:
            assert isinstance(self.backend, SimulatedBackend)
            self.backend.lose_gpu(gpu.uuid)
        else:
            self.node.lose(gpu.index)

    def xid(self, gpu: Gpu, xid: int) -> None:
        if self.node is None:
            assert isinstance(self.backend, SimulatedBackend)
            self.backend.raise_xid(gpu.uuid, xid)
        else:
            self.node.xid(gpu.index, xid)

    def events(self, gpus: tuple[Gpu, ...]) -> HealthEventSource:
        """`gpus`: as discovered, which the NVML source reports lost GPUs under."""
        if self.node is None:
            assert isinstance(self.backend, SimulatedBackend)
            return SimulatedEvents(self.backend, interval_seconds=0.02)
        return NvmlEvents(wait_ms=50, known_gpus={gpu.index: gpu.uuid for gpu in gpus})


@pytest.fixture(params=["simulated", "mock-nvml"])
async def faulty(
    request: pytest.FixtureRequest, tmp_path: Path, mock_driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Faults]:
    if request.param == "simulated":
        opened: HardwareBackend = SimulatedBackend(CONTRACT_NODE, resolve_node_spec(CONTRACT_PROFILE))
        node = None
    else:
        opened, node = open_mock_nvml(tmp_path, mock_driver_root, monkeypatch)
    yield Faults(opened, node)
    await opened.close()


async def test_a_failed_creation_leaves_nothing_behind(faulty: Faults) -> None:
    gpu = await mig_gpu(faulty.backend)
    profile, placement = free_slot(gpu)
    before = await faulty.backend.discover()

    faulty.fail_compute_instance_creation()
    error = await refused(faulty.backend.create_mig_instance(gpu.uuid, profile.profile_id, placement))

    assert error.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES, error
    assert await faulty.backend.discover() == before


async def test_a_lost_gpu_leaves_discovery_and_refuses_mig_changes(faulty: Faults) -> None:
    gpu = await mig_gpu(faulty.backend)
    profile, placement = free_slot(gpu)
    before = await faulty.backend.discover()

    faulty.lose(gpu)
    after = await faulty.backend.discover()
    create = await refused(faulty.backend.create_mig_instance(gpu.uuid, profile.profile_id, placement))

    assert after == tuple(other for other in before if other.uuid != gpu.uuid)
    assert create.reason is HardwareErrorReason.GPU_LOST, create


async def test_xids_and_a_lost_gpu_arrive_as_health_events(faulty: Faults) -> None:
    gpus = await faulty.backend.discover()
    first, second = gpus[:2]

    async def collect() -> list[HealthEvent]:
        """The GPU is lost only once the XID has arrived, that is once the source is watching."""
        source = faulty.events(gpus)
        source.start()
        faulty.xid(first, 48)
        async with asyncio.timeout(10):
            received = [await anext(source)]
            faulty.lose(second)
            received.append(await anext(source))
        await source.stop()
        return received

    events = await collect()

    assert [(type(event).__name__, event.gpu_uuid) for event in events] == [
        ("XidEvent", first.uuid),
        ("GpuLost", second.uuid),
    ]
    assert isinstance(events[0], XidEvent)
    assert events[0].xid == 48


async def test_a_gpu_lost_before_the_watch_starts_is_reported(faulty: Faults) -> None:
    gpus = await faulty.backend.discover()
    gpu = gpus[3]
    source = faulty.events(gpus)
    faulty.lose(gpu)

    async def first_event() -> HealthEvent:
        source.start()
        async with asyncio.timeout(10):
            event = await anext(source)
        await source.stop()
        return event

    event = await first_event()

    assert (type(event).__name__, event.gpu_uuid) == ("GpuLost", gpu.uuid)


# --- the simulated rules against a brute-force oracle ---------------------------------------------


# Everything an instance draws from its GPU besides memory slices (MigProfile field names).
RESOURCES = (
    "memory_bytes",
    "multiprocessors",
    "copy_engines",
    "decoders",
    "encoders",
    "jpeg_engines",
    "ofa_engines",
)
ORACLE_MODELS = sorted(key for key, model in gpu_models().items() if model.mig is not None)


@dataclass
class Oracle:
    """NVML's admission rules restated as plainly as possible, independent of the backend's code."""

    gpu: Gpu
    max_gpu_instances: int
    instances: dict[int, tuple[MigProfile, Placement]] = field(default_factory=dict)

    def budget(self, resource: str) -> int:
        """The GPU's memory, and for everything else what the full-GPU profile gets."""
        if resource == "memory_bytes":
            return self.gpu.memory_bytes
        full_gpu = max(self.gpu.mig_profiles, key=lambda p: p.compute_slices)
        return int(getattr(full_gpu, resource))

    def decide(self, profile: MigProfile, placement: Placement) -> HardwareErrorReason | None:
        if placement not in profile.placements:
            return HardwareErrorReason.INVALID_ARGUMENT
        taken = {s for _, p in self.instances.values() for s in range(p.start, p.start + p.size)}
        wanted = set(range(placement.start, placement.start + placement.size))
        same_profile = [p for p, _ in self.instances.values() if p.profile_id == profile.profile_id]
        layout = [p for p, _ in self.instances.values()] + [profile]
        over_budget = any(sum(getattr(p, r) for p in layout) > self.budget(r) for r in RESOURCES)
        if (
            taken & wanted
            or len(same_profile) >= profile.max_instances
            or len(self.instances) >= self.max_gpu_instances
            or over_budget
        ):
            return HardwareErrorReason.INSUFFICIENT_RESOURCES
        return None


# ("create", profile number, index into the profile's placements or any (start, size)) or
# ("destroy", GPU instance id, unused): half the creates name a valid placement so layouts fill up.
Step = tuple[str, int, int | tuple[int, int]]
create_step = st.tuples(
    st.just("create"),
    st.integers(0, 10),
    st.one_of(st.integers(0, 7), st.tuples(st.integers(0, 7), st.integers(1, 8))),
)
destroy_step = st.tuples(st.just("destroy"), st.integers(1, 8), st.just(0))


@pytest.mark.parametrize("model", ORACLE_MODELS)
@given(steps=st.lists(st.one_of(create_step, destroy_step), max_size=40))
# Profile 1 is the "+me" profile on every MIG model: a second one is past its instance limit, and on
# A30 profile 3 ("2g.12gb+me") next to it needs the one JPEG and OFA the first one holds.
@example(steps=[("create", 1, 0), ("create", 1, 2)])
@example(steps=[("create", 1, 0), ("create", 3, 1), ("destroy", 1, 0), ("create", 3, 1)])
def test_simulated_mig_decisions_match_a_brute_force_oracle(model: str, steps: list[Step]) -> None:
    asyncio.run(replay(SimulatedBackend("n", one_mig_gpu(model)), model, steps))


def one_mig_gpu(model: str) -> SimulatedNodeSpec:
    return parse_node_spec({"gpus": [{"model": model, "count": 1, "migMode": "enabled"}]}, "t")


@pytest.fixture(scope="session")
def oracle_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MockNode]:
    """One mock node of one MIG-enabled GPU per model; each example starts it afresh."""
    directory = tmp_path_factory.mktemp("oracle")
    return {model: MockNode.create(directory / model, "n", one_mig_gpu(model)) for model in ORACLE_MODELS}


@pytest.mark.parametrize("model", ORACLE_MODELS)
# Fewer examples than the simulated run (100): each step is some fifty NVML calls through ctypes.
@settings(max_examples=50)
@given(steps=st.lists(st.one_of(create_step, destroy_step), max_size=40))
@example(steps=[("create", 1, 0), ("create", 1, 2)])
@example(steps=[("create", 1, 0), ("create", 3, 1), ("destroy", 1, 0), ("create", 3, 1)])
def test_nvml_over_the_mock_makes_the_oracles_mig_decisions(
    model: str, steps: list[Step], oracle_nodes: dict[str, MockNode], mock_driver_root: Path
) -> None:
    node = oracle_nodes[model]
    node.state_file.unlink(missing_ok=True)
    saved = {name: os.environ.get(name) for name in node.environment()}
    os.environ.update(node.environment())
    backend = NvmlBackend(node.pci_devices, mock_driver_root)
    try:
        asyncio.run(replay(backend, model, steps))
    finally:
        asyncio.run(backend.close())
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def replay(backend: HardwareBackend, model: str, steps: list[Step]) -> None:
    """Replays `steps` on the backend's only GPU, checking each outcome against the oracle."""
    gpu = (await backend.discover())[0]
    geometry = gpu_models()[model].mig
    assert geometry is not None
    oracle = Oracle(gpu, max_gpu_instances=geometry.max_gpu_instances)
    for kind, number, where in steps:
        if kind == "create":
            profile = gpu.mig_profiles[number % len(gpu.mig_profiles)]
            placement = (
                profile.placements[where % len(profile.placements)]
                if isinstance(where, int)
                else Placement(*where)
            )
            await check_create(backend, oracle, profile, placement)
        else:
            await check_destroy(backend, oracle, number)
        current = (await backend.discover())[0].mig_instances
        assert {i.gpu_instance_id: (i.profile_id, i.placement) for i in current} == {
            gi: (p.profile_id, placement) for gi, (p, placement) in oracle.instances.items()
        }
        assert_invariants(gpu, current)


async def check_create(
    backend: HardwareBackend, oracle: Oracle, profile: MigProfile, placement: Placement
) -> None:
    expected = oracle.decide(profile, placement)
    try:
        instance = await backend.create_mig_instance(oracle.gpu.uuid, profile.profile_id, placement)
    except HardwareError as error:
        assert error.reason is expected, f"{profile.name} at {placement}: {error}"
        return
    assert expected is None, f"{profile.name} at {placement} was accepted, the oracle says {expected}"
    assert instance.gpu_instance_id == min(set(range(1, 10)) - set(oracle.instances))
    oracle.instances[instance.gpu_instance_id] = (profile, placement)


async def check_destroy(backend: HardwareBackend, oracle: Oracle, gpu_instance_id: int) -> None:
    try:
        await backend.destroy_mig_instance(oracle.gpu.uuid, gpu_instance_id)
    except HardwareError as error:
        assert gpu_instance_id not in oracle.instances
        assert error.reason is HardwareErrorReason.NOT_FOUND
        return
    del oracle.instances[gpu_instance_id]


def assert_invariants(gpu: Gpu, instances: tuple[MigInstance, ...]) -> None:
    slices = [s for instance in instances for s in instance.placement.memory_slices]
    assert len(slices) == len(set(slices)), instances
    counts = Counter(instance.profile_id for instance in instances)
    for profile in gpu.mig_profiles:
        assert counts[profile.profile_id] <= profile.max_instances
