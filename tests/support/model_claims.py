"""Claims allocated by the allocator model (dra_driver.packing.allocator), served to the claim
engine as the API server would serve them after the scheduler allocated them: each result with
its driver, pool and device, and on a device that allows multiple allocations a shareID and the
capacity the share consumed. The claim source the engine GETs claims from.

With it a test asks the question issue 48 is about: does every allocation the scheduler can make
from what we publish also prepare?
"""

import asyncio
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.calls import RawClaim
from dra_driver.claims.engine import SharingControls
from dra_driver.claims.sharing.mps import SimulatedMps
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import quantity
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from dra_driver.packing.allocator import Allocation, Claim, NodeState, Pool
from tests.support.engines import simulated_engine, simulated_hardware

NAMESPACE = "default"
POOL = "node-a"


class ModelClaims:
    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def add(
        self,
        name: str,
        allocation: Allocation,
        inventory: Inventory,
        configs: Sequence[Mapping[str, Any]] = (),
    ) -> RawClaim:
        """`configs`: opaque parameters of our driver, each for every request of the claim."""
        results = []
        for result in allocation.results:
            rendered: dict[str, Any] = {
                "request": result.request,
                "driver": DEFAULT_DRIVER_NAME,
                "pool": self.pool,
                "device": result.device,
            }
            if inventory.device_by_name[result.device].allow_multiple_allocations:
                rendered["shareID"] = str(uuid.uuid4())
                rendered["consumedCapacity"] = {
                    capacity: quantity(amount) for capacity, amount in result.consumed.items()
                }
            results.append(rendered)
        claim_uid = str(uuid.uuid4())
        config = [
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {"driver": DEFAULT_DRIVER_NAME, "parameters": dict(parameters)},
            }
            for parameters in configs
        ]
        self.claims[(NAMESPACE, name)] = {
            "metadata": {"namespace": NAMESPACE, "name": name, "uid": claim_uid},
            "status": {"allocation": {"devices": {"results": results, "config": config}}},
        }
        return RawClaim(NAMESPACE, name, claim_uid)

    async def get(self, namespace: str, name: str) -> object:
        return self.claims[(namespace, name)]


# A claim to allocate, and the opaque parameters of our driver it carries.
ClaimAndConfigs = tuple[Claim, Sequence[Mapping[str, Any]]]


@dataclass
class Outcome:
    allocated: int = 0
    unschedulable: int = 0
    prepared: int = 0
    # One line per prepare or unprepare that failed: the claim, its devices and the error.
    failures: list[str] = field(default_factory=list)


def allocate_and_prepare(profile: str, inventory: Inventory, stream: Sequence[ClaimAndConfigs]) -> Outcome:
    """Each claim of `stream` allocated by the model around those before it, and prepared by the
    claim engine on the simulated node `profile` (whose GPUs `inventory` offers) as soon as it is
    allocated; at the end everything prepared is unprepared."""
    outcome = Outcome()
    state = NodeState(Pool.from_inventory(inventory, DEFAULT_DRIVER_NAME))
    claims = ModelClaims(POOL)
    gpus = {gpu.uuid for gpu in inventory.gpu_of_device.values()}
    with tempfile.TemporaryDirectory(prefix="amp-", dir="/tmp") as directory:
        root = Path(directory)
        engine = simulated_engine(
            root,
            claims,
            pool=POOL,
            inventory=inventory,
            hardware=simulated_hardware(root, profile, POOL),
            sharing=SharingControls(SimulatedTimeSlicer(gpus), SimulatedMps(root / "mps")),
        )

        async def run() -> None:
            await engine.load_state()
            prepared = []
            for index, (claim, configs) in enumerate(stream):
                allocation = state.allocate(claim)
                if not isinstance(allocation, Allocation):
                    outcome.unschedulable += 1  # the scheduler says so, and nothing is bound
                    continue
                state.add(allocation)
                outcome.allocated += 1
                raw = claims.add(f"claim-{index}", allocation, inventory, configs)
                if error := (await engine.prepare([raw]))[raw.uid].error:
                    outcome.failures.append(f"claim {index} on {allocation.devices}: {error}")
                else:
                    prepared.append(raw)
            outcome.prepared = len(prepared)
            unprepared = await engine.unprepare(prepared)
            outcome.failures += [f"unprepare {uid}: {error}" for uid, error in unprepared.items() if error]

        asyncio.run(run())
    return outcome
