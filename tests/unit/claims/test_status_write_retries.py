"""The claim status writer tries again by the class of what failed (base/errors.py): a
TransientFault is tried again at the backoff; a ClaimFault, or an API answer that is final, ends
the write after one try. A write that stops following the class fails here, not as a write
retried for ever or a status never written after one 503."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import ClaimFault, DriverError, TransientFault
from dra_driver.base.json_object import JsonObject
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.kube.errors import ApiError
from dra_driver.observability.metrics import ClaimStatusMetrics

REF = ClaimRef("default", "claim", "uid-1")


class FailingClaims:
    """A ClaimApi whose GETs raise `failures` in turn, then a ClaimFault (the write ends)."""

    def __init__(self, failures: list[DriverError]) -> None:
        self.failures = failures
        self.gets = 0

    async def get(self, namespace: str, name: str) -> JsonObject:
        self.gets += 1
        if self.failures:
            raise self.failures.pop(0)
        raise ClaimFault("the end of the script")

    async def replace_status(self, namespace: str, name: str, body: JsonObject) -> JsonObject:
        raise AssertionError("no claim is read, so none is written")


async def written(failures: list[DriverError]) -> tuple[int, dict[str, float]]:
    """The GETs made, and the writes counted by result."""
    metrics = ClaimStatusMetrics(CollectorRegistry())
    api = FailingClaims(failures)

    writer = ClaimStatusWriter(
        api,  # type: ignore[arg-type]
        "gpu.nvidia.com",
        metrics,
        backoff=Backoff(first=0.001, cap=0.001),
        settle_seconds=0,
    )
    writer.submit(REF, None, lambda now: ({"driver": "gpu.nvidia.com"},))
    await asyncio.wait_for(writer.wait_idle(), 5)
    counts = {
        sample.labels["result"]: sample.value
        for metric in metrics.registry.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and "result" in sample.labels
    }
    return api.gets, counts


async def test_a_transient_fault_is_tried_again_whether_or_not_it_is_an_api_answer() -> None:
    gets, counts = await written(
        [ApiError("GET claim", 503, "", "etcd"), ApiError("GET claim", 0, "", "reset"), TransientFault("x")]
    )

    assert gets == 4
    assert counts["failed"] == 3 and counts["dropped"] == 1


async def test_a_claim_fault_ends_the_write_at_once() -> None:
    gets, counts = await written([ClaimFault("status.devices: cannot be decoded")])

    assert gets == 1
    assert counts["dropped"] == 1 and counts.get("failed", 0) == 0


@pytest.mark.parametrize("status", [400, 403, 422])
async def test_a_final_answer_ends_the_write_at_once(status: int) -> None:
    gets, counts = await written([ApiError("GET claim", status, "", "refused")])

    assert gets == 1
    assert counts["rejected"] == 1 and counts.get("failed", 0) == 0


async def test_a_claim_that_is_gone_is_dropped_not_rejected() -> None:
    gets, counts = await written([ApiError("GET claim", 404, "NotFound", "gone")])

    assert gets == 1
    assert counts["dropped"] == 1 and counts.get("rejected", 0) == 0
