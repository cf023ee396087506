"""The slice controller's work queue tries a failed sync again by the class of the failure
(kube/errors.py, KEPT_TRYING): a TransientFault of any layer, and the API server's final answer
(RBAC, a refused field: fixed outside the agent), are tried again at the queue's backoff; any
other fault ends the controller instead of being retried for ever."""

import asyncio

import pytest

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import ClaimFault, DriverError, OperatorFault, TransientFault
from dra_driver.kube.errors import ApiError
from dra_driver.publish.controller import OutdatedList, ResourceSliceController
from dra_driver.publish.workqueue import RateLimiter, WorkQueue


async def syncs_until(failures: list[DriverError]) -> tuple[int, list[int]]:
    """Runs the controller's queue worker on syncs that raise `failures` in turn, then succeed;
    the syncs made, and the failure count of the key at each sync."""
    queue: WorkQueue[str] = WorkQueue(RateLimiter(Backoff(first=0.001, cap=0.001)))
    controller = ResourceSliceController(
        None,  # type: ignore[arg-type]  # no sync reaches the API here
        "gpu.nvidia.com",
        "node-a",
        None,  # type: ignore[arg-type]
        queue=queue,
    )
    counted: list[int] = []

    async def sync() -> None:
        counted.append(queue.limiter.failures("node-a"))
        if failures:
            raise failures.pop(0)
        queue.shut_down()

    controller._sync = sync  # type: ignore[method-assign]

    queue.add("node-a")
    await asyncio.wait_for(controller._work(), 5)
    return len(counted), counted


async def test_transient_faults_of_any_layer_and_final_answers_are_synced_again() -> None:
    syncs, counted = await syncs_until(
        [
            ApiError("POST resourceslices", 503, "", "etcd"),
            OutdatedList("LIST resourceslices: answered at 3, older than 5"),
            TransientFault("a fault of the moment, of no API call"),
            ApiError("POST resourceslices", 403, "Forbidden", "RBAC"),
            ApiError("PUT resourceslices/a", 422, "Invalid", "a field refused"),
        ]
    )

    assert syncs == 6
    assert counted == [0, 1, 2, 3, 4, 5], "each failure in a row backs off longer"


@pytest.mark.parametrize("fault", [ClaimFault("no claim's business"), OperatorFault("--node-config: wrong")])
async def test_a_fault_that_no_sync_can_mend_ends_the_controller(fault: DriverError) -> None:
    with pytest.raises(type(fault)):
        await syncs_until([fault])
