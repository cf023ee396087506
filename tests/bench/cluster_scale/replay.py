"""A trace replayed through the real scheduler, one event at a time, so that every pod meets the
state the one before it left (the order the allocator model assumes): lift the pod's scheduling
gate, wait until the scheduler binds it or calls it unschedulable, read its claim's allocation.
Pods are created, gated, up to `AHEAD` arrivals before their turn, so the resourceclaim
controller has made their claims by then: from a pod created to its claim made and the pod
requeued took about 100 ms a pod, ten times the scheduling itself. A refused pod is
deleted at once, as the model's refused claim never comes back; a departing pod is deleted and
its claim waited out (the resourceclaim controller deletes it, which frees its devices).
"""

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from dra_driver.base.quantity import UP_TO_TERA, parse_quantity
from dra_driver.kube.errors import ApiError
from dra_driver.packing.allocator import Allocation, DeviceResult
from dra_driver.packing.shapes import PodShape
from dra_driver.packing.trace_file import Trace
from tests.bench.cluster_scale import objects
from tests.bench.cluster_scale.api import CORE, RESOURCE, Api
from tests.bench.cluster_scale.model import FleetModel, Placement
from tests.bench.cluster_scale.needs import Need

POLL = 0.003
AHEAD = 64
DECIDE_TIMEOUT = 120.0


class RunResult(msgspec.Struct):
    placed: int = 0
    refused: int = 0
    # (trace seconds, the fleet's use just after the event)
    series: list[tuple[float, dict[str, float]]] = msgspec.field(default_factory=list)
    # Pod created -> bound or unschedulable, seconds, as this client saw it.
    decide_seconds: list[float] = msgspec.field(default_factory=list)
    wall_seconds: float = 0.0


def _amount(text: object) -> int:
    quantity = parse_quantity(str(text))
    amount = quantity.whole_number(UP_TO_TERA) if quantity is not None else None
    if amount is None:
        raise ValueError(f"consumedCapacity: expected a whole quantity, got {text!r}")
    return amount


def allocation_of(claim: Mapping[str, Any]) -> tuple[str, Allocation]:
    """The pool (node) and devices of an allocated claim's status."""
    results = claim["status"]["allocation"]["devices"]["results"]
    pools = {result["pool"] for result in results}
    if len(pools) != 1:
        raise ValueError(
            f"claim {claim['metadata']['name']}: results from pools {sorted(pools)}, expected one"
        )
    return pools.pop(), Allocation(
        tuple(
            DeviceResult(
                result["request"],
                result["device"],
                {name: _amount(value) for name, value in result.get("consumedCapacity", {}).items()},
            )
            for result in results
        )
    )


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        condition["type"] == "PodScheduled"
        and condition["status"] == "False"
        and condition.get("reason") == "Unschedulable"
        for condition in pod.get("status", {}).get("conditions", [])
    )


class Replay:
    def __init__(self, api: Api, namespace: str, templates: Mapping[Need, str], model: FleetModel) -> None:
        self.api = api
        self.namespace = namespace
        self.templates = templates
        self.model = model
        # pod -> (node, allocation, claim name) while it holds devices
        self.live: dict[int, tuple[str, Allocation, str]] = {}

    def _pod_path(self, pod: int) -> str:
        return f"{CORE}/namespaces/{self.namespace}/pods/p{pod:06d}"

    def _claim_path(self, claim: str) -> str:
        return f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims/{claim}"

    async def _decided(self, pod: int) -> dict[str, Any]:
        deadline = time.monotonic() + DECIDE_TIMEOUT
        while time.monotonic() < deadline:
            found = await self.api.get(self._pod_path(pod))
            if found is not None and (found["spec"].get("nodeName") or _unschedulable(found)):
                return found
            await asyncio.sleep(POLL)
        raise TimeoutError(f"pod p{pod:06d}: neither bound nor unschedulable after {DECIDE_TIMEOUT:.0f}s")

    async def create_gated(self, pods: list[tuple[int, Need]]) -> None:
        await asyncio.gather(
            *(
                self.api.create(
                    f"{CORE}/namespaces/{self.namespace}/pods",
                    objects.pod(f"p{pod:06d}", self.templates[need]),
                )
                for pod, need in pods
            )
        )

    async def _lift_gate(self, pod: int) -> None:
        path = self._pod_path(pod)
        while True:
            found = await self.api.get(path)
            if found is None:
                raise RuntimeError(f"pod p{pod:06d} was never created")
            found["spec"]["schedulingGates"] = [
                gate for gate in found["spec"].get("schedulingGates", []) if gate["name"] != objects.TURN_GATE
            ]
            try:
                await self.api.replace(path, found)
                return
            except ApiError as error:
                if error.status != 409:  # someone (the claim controller) changed it meanwhile
                    raise

    async def arrive(self, pod: int) -> Placement:
        await self._lift_gate(pod)
        found = await self._decided(pod)
        node = found["spec"].get("nodeName")
        if not node:
            await self.api.delete(self._pod_path(pod))
            return Placement(None)
        claim_name = found["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = await self.api.get(self._claim_path(claim_name))
        if claim is None:
            raise RuntimeError(f"pod p{pod:06d} is bound but its claim {claim_name} is gone")
        pool, allocation = allocation_of(claim)
        if pool != node:
            raise RuntimeError(f"pod p{pod:06d} is bound to {node} with devices of pool {pool}")
        self.live[pod] = (node, allocation, claim_name)
        return Placement(node, allocation)

    async def depart(self, pod: int) -> None:
        held = self.live.pop(pod, None)
        if held is None:
            return  # refused: nothing to give back
        node, allocation, claim_name = held
        await self.api.delete(self._pod_path(pod))
        deadline = time.monotonic() + DECIDE_TIMEOUT
        while await self.api.get(self._claim_path(claim_name)) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"claim {claim_name} of departed pod p{pod:06d} still there")
            await asyncio.sleep(POLL)
        self.model.remove(node, allocation)

    async def run(self, trace: Trace, needs: Mapping[PodShape, Need], progress: int = 200) -> RunResult:
        result = RunResult()
        started = time.monotonic()
        arrivals = 0
        upcoming = [(event.pod, needs[event.shape]) for event in trace.events if event.shape is not None]
        created = 0
        for event in trace.events:
            if event.shape is None:
                await self.depart(event.pod)
            else:
                need = needs[event.shape]
                if created <= arrivals + AHEAD // 2:
                    batch = upcoming[created : arrivals + AHEAD]
                    await self.create_gated(batch)
                    created += len(batch)
                asked = time.monotonic()
                placement = await self.arrive(event.pod)
                result.decide_seconds.append(time.monotonic() - asked)
                self.model.check(event.pod, need.label, need.model_claim(), placement)
                if placement.node is None:
                    result.refused += 1
                else:
                    result.placed += 1
                arrivals += 1
                if arrivals % progress == 0:
                    print(
                        f"cluster-scale:   {arrivals}/{trace.arrivals} pods, {result.refused} refused, "
                        f"{time.monotonic() - started:.0f}s",
                        flush=True,
                    )
            result.series.append((event.seconds, dict(self.model.usage())))
        result.wall_seconds = time.monotonic() - started
        return result
