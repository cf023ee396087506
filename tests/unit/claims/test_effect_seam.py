"""The record protocol, proven once for the side-effect seam (claims/effects/contract.py): for a
claim of each kind of recorded effect, through the engine as kubelet drives it,

- every entry is on disk, in a "preparing" record, before its effect's `apply` runs;
- an undo tolerates changes that are already gone (a prepared record left behind by an unprepare
  that crashed after its undo) and changes that never happened (a "preparing" record left behind by
  a crash right after it was written), leaving the node as it was before the claim.

The kill -9 campaigns (tests/contract/test_crash_safety.py) then check each effect at each step.
"""

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dra_driver.claims.effect_entries import (
    ClaimMpsEntry,
    EffectEntry,
    MigInstanceEntry,
    TimeSliceEntry,
    VfioEntry,
)
from dra_driver.claims.effects.contract import Made, SideEffect
from dra_driver.claims.engine import ClaimEngine, SharingControls
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.mps import SimulatedMps
from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.node_config import NodeConfig
from dra_driver.hardware.pci_binding import VFIO_DRIVER
from dra_driver.hardware.simulated_pci import GPU_DRIVER, SimulatedPciBinding, make_pci_tree
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from tests.support.engines import simulated_engine, simulated_hardware
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import simulated_node

DRIVER = "gpu.dra-driver.dev"


class Node(msgspec.Struct):
    """A node with one kind of effect to make: a fresh engine on it (as after an agent restart)
    and what of the node that effect changes."""

    engine: Callable[[], ClaimEngine]
    state: Callable[[], Awaitable[object]]
    results: tuple[dict[str, Any], ...]
    config: tuple[dict[str, Any], ...] = ()


def _gpu_config(sharing: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    parameters = {"apiVersion": "resource.dra-driver.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing}
    return ({"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": parameters}},)


def _mig_node(tmp: Path, claims: MemoryClaims, scratch: list[Path]) -> Node:
    profile, config = "dgx-h100-mig", NodeConfig(default=GpuSettings(mode="mig-dynamic"))

    def engine() -> ClaimEngine:
        return simulated_engine(tmp, claims, profile, config, hardware=simulated_hardware(tmp, profile))

    async def state() -> object:
        return [(gpu.uuid, gpu.mig_instances) for gpu in await simulated_hardware(tmp, profile).discover()]

    return Node(
        engine, state, ({"device": "gpu-0-mig-1g10gb-0"}, {"request": "b", "device": "gpu-1-mig-3g40gb-4"})
    )


def _vfio_node(tmp: Path, claims: MemoryClaims, scratch: list[Path]) -> Node:
    gpus = simulated_node("l4x8")
    make_pci_tree(tmp / "sys", gpus, (GPU_DRIVER, VFIO_DRIVER))
    pci = SimulatedPciBinding(tmp / "sys")
    config = NodeConfig(default=GpuSettings(mode="vfio"))

    async def state() -> object:
        return [pci.driver(gpu.pci_bus_id) for gpu in gpus]

    return Node(
        lambda: simulated_engine(tmp, claims, "l4x8", config, pci=pci),
        state,
        ({"device": "gpu-2"}, {"request": "b", "device": "gpu-6"}),
    )


MakeNode = Callable[[Path, MemoryClaims, list[Path]], Node]


def _sharing_node(sharing: dict[str, Any]) -> MakeNode:
    def node(tmp: Path, claims: MemoryClaims, scratch: list[Path]) -> Node:
        gpus = simulated_node("t4x4")
        slicer = SimulatedTimeSlicer(gpu.uuid for gpu in gpus)
        # A short path: the MPS pipe directory's name must fit a unix socket's.
        runtime = Path(tempfile.mkdtemp(prefix="mps-"))
        scratch.append(runtime)
        mps = SimulatedMps(runtime)
        controls = SharingControls(slicer, mps)

        async def state() -> object:
            slices = [await slicer.current(gpu.uuid) for gpu in gpus]
            return slices, sorted(await asyncio.to_thread(os.listdir, runtime))

        return Node(
            lambda: simulated_engine(tmp, claims, "t4x4", NodeConfig(), sharing=controls),
            state,
            ({"device": "gpu-1"}, {"request": "b", "device": "gpu-3"}),
            _gpu_config(sharing),
        )

    return node


NODES: dict[str, tuple[MakeNode, type[EffectEntry]]] = {
    "mig instance": (_mig_node, MigInstanceEntry),
    "vfio binding": (_vfio_node, VfioEntry),
    "time slice": (
        _sharing_node({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        TimeSliceEntry,
    ),
    "claim mps daemon": (_sharing_node({"strategy": "MPS"}), ClaimMpsEntry),
}


@pytest.fixture
def scratch() -> Iterator[list[Path]]:
    """Directories outside tmp_path (short paths, for unix sockets), removed after the test."""
    made: list[Path] = []
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _spy_on_apply(monkeypatch: pytest.MonkeyPatch, store: ClaimRecordStore, seen: list[ClaimRecord]) -> None:
    """Every effect's apply first reads the claim's record from disk: the one it acts under."""
    for kind in _effect_kinds():
        original = kind.apply

        async def apply(
            self: SideEffect[Any],
            ref: ClaimRef,
            actions: Sequence[Any],
            original: Callable[..., Awaitable[Made]] = original,
        ) -> Made:
            record = store.read(ref.uid)
            assert record is not None, f"{type(self).__name__}.apply ran with no record on disk"
            assert record.state == "preparing"
            if self.recorded:
                missing = [self.entry(a) for a in actions if self.entry(a) not in record.effects]
                assert missing == [], f"{type(self).__name__}.apply ran before its entries were on disk"
            seen.append(record)
            return await original(self, ref, actions)

        monkeypatch.setattr(kind, "apply", apply)


def _effect_kinds() -> list[type[SideEffect[Any]]]:
    found, todo = [], list(SideEffect.__subclasses__())
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return found


@pytest.mark.parametrize("kind", sorted(NODES))
async def test_entries_are_on_disk_before_their_effect_and_undo_tolerates_gone_and_never_made(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scratch: list[Path]
) -> None:
    make_node, entry_type = NODES[kind]
    claims = MemoryClaims()
    node = make_node(tmp_path, claims, scratch)
    claim = claims.add("seam", *node.results, config=node.config)
    store = ClaimRecordStore(tmp_path / "state")
    before = await node.state()

    engine = node.engine()
    await engine.load_state()
    seen: list[ClaimRecord] = []
    _spy_on_apply(monkeypatch, store, seen)
    assert (await engine.prepare([claim]))[claim.uid].error == ""
    assert seen, "no effect was applied"
    preparing = seen[0]
    prepared = engine.prepared_claims[claim.uid]
    assert prepared.entries(entry_type), f"the claim made no {entry_type.__name__}"
    assert await node.state() != before, "the effect changed nothing on the node"
    assert (await engine.unprepare([claim]))[claim.uid] == ""
    engine.close()
    assert await node.state() == before

    # Changes already gone: the prepared record back, as if unprepare died after its undo.
    store.save(prepared)
    again = node.engine()
    await again.load_state()
    assert claim.uid in again.prepared_claims
    assert (await again.unprepare([claim]))[claim.uid] == ""
    again.close()
    assert await node.state() == before
    assert store.read(claim.uid) is None

    # Changes never made: the first "preparing" record, as if the agent died right after writing it.
    store.save(preparing)
    restarted = node.engine()
    await restarted.load_state()
    restarted.close()
    assert await node.state() == before
    assert store.read(claim.uid) is None
    assert restarted.prepared_claims == {}
