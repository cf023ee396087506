"""The agent (in-process, on simulated GPUs) started in mode mig-dynamic on a GPU that already has
MIG instances: the one a prepared claim's record names keeps its placement device, the one made
by hand is offered as a static device and prepared as one, and no placement overlaps it."""

from pathlib import Path

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.agent.node import NodeAgent
from dra_driver.claims.calls import RawClaim
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord, PreparedDevice
from dra_driver.claims.source import OfflineClaimSource
from dra_driver.config.settings import NodeSettings
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import resolve_node_spec
from dra_driver.state.boot_id import current_boot_id
from tests.support.engines import agent_settings

NODE = "node-a"
# mig-parted's layout left in place: two 3g.40gb instances, on slices 0-3 and 4-7.
HARDWARE = """gpus:
  - model: A100-SXM4-80GB
    count: 1
    migMode: enabled
    migInstances: [{profile: 3g.40gb, start: 0}, {profile: 3g.40gb, start: 4}]
"""
EARLIER_UID, NEW_UID = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f", "1c8d5e7f-2a3b-4c5d-9e0f-1a2b3c4d5e6f"
HAND_MADE, CLAIMED = "gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"


def node_settings(root: Path) -> NodeSettings:
    (root / "node.yaml").write_text(HARDWARE)
    (root / "config.yaml").write_text("default: {mode: mig-dynamic}\n")
    return agent_settings(root, f"simulated:{root / 'node.yaml'}", NODE, root / "config.yaml")


def claim_holding_the_instance_at_4(state_dir: Path, gpu_uuid: str) -> None:
    """As if a claim prepared on placement 4 before the agent restarted: its record names the
    instance it made."""
    store = ClaimRecordStore(state_dir)
    store.boot_changed(current_boot_id())
    store.save(
        ClaimRecord(
            claim=ClaimRef("default", "earlier", EARLIER_UID),
            devices=(PreparedDevice(("gpu",), NODE, CLAIMED, ()),),
            effects=(MigInstanceEntry(gpu_uuid, 9, 4, 4),),
        )
    )


def allocated(name: str, uid: str, device: str) -> dict[str, object]:
    result = {"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": NODE, "device": device}
    return {
        "metadata": {"namespace": "default", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": [result], "config": []}}},
    }


async def test_a_hand_made_instance_is_offered_static_and_a_claimed_one_keeps_its_placement(
    short_dir: Path,
) -> None:
    settings = node_settings(short_dir)
    claim = allocated("new", NEW_UID, HAND_MADE)
    source = OfflineClaimSource({("default", "new"): claim})

    (gpu,) = await SimulatedBackend(NODE, resolve_node_spec(str(short_dir / "node.yaml"))).discover()
    claim_holding_the_instance_at_4(settings.state_dir, gpu.uuid)
    agent = await NodeAgent.start(settings, source)
    try:
        inventory = agent.inventory
        hand_made = inventory.device_by_name[HAND_MADE]
        assert not hand_made.consumes_counters and "uuid" in hand_made.attributes
        claimed = inventory.device_by_name[CLAIMED]
        assert claimed.consumes_counters and "uuid" not in claimed.attributes
        # Placements only on the claimed instance's slices, 4-7: the hand-made one has 0-3.
        dynamic = [device for device in inventory.devices if device.consumes_counters]
        assert {device.attributes["placementStart"] for device in dynamic} <= {4, 5, 6, 7}
        (counter_set,) = inventory.counter_sets
        assert [counter_set.counters[f"memory-slice-{i}"] for i in range(8)] == [0] * 4 + [1] * 4

        outcome = await agent.engine.prepare([RawClaim("default", "new", NEW_UID)])
        assert outcome[NEW_UID].error == "", outcome
    finally:
        await agent.stop()
