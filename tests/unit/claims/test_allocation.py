import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.claims.allocation import AllocatedDevice, ClaimRejected, allocated_devices
from dra_driver.claims.identity import claim_ref

REF = claim_ref("default", "c", "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17")
DRIVER = "gpu.dra-driver.dev"


def claim(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": "c", "uid": REF.uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_only_our_results_are_kept_with_their_main_request() -> None:
    devices = allocated_devices(
        claim(
            [
                {"request": "gpu/big", "driver": DRIVER, "pool": "n", "device": "gpu-0"},
                {"request": "nic", "driver": "net.example.com", "pool": "n", "device": "eth0"},
            ]
        ),
        REF,
        DRIVER,
    )

    assert devices == (AllocatedDevice(request="gpu/big", pool="n", device="gpu-0", position=0),)
    assert devices[0].main_request == "gpu"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("metadata"), "claim.metadata is missing"),
        (lambda c: c["metadata"].update(uid=7), "metadata.uid: expected a string, got the integer 7"),
        (lambda c: c.pop("status"), "is not allocated (status.allocation is missing)"),
        (
            lambda c: c["status"].update(allocation="yes"),
            'status.allocation: expected an object, got the string "yes"',
        ),
        (
            lambda c: c["status"]["allocation"]["devices"].update(results={}),
            "status.allocation.devices.results: expected a list, got an object",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"].append(3),
            "status.allocation.devices.results[1]: expected an object, got the integer 3",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("device"),
            "status.allocation.devices.results[0].device is missing",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool=["n"]),
            "status.allocation.devices.results[0].pool: expected a string, got a list",
        ),
    ],
)
def test_malformed_claims_are_rejected_naming_the_field(mutate: Any, message: str) -> None:
    broken = claim([{"request": "gpu", "driver": DRIVER, "pool": "n", "device": "gpu-0"}])
    mutate(broken)

    with pytest.raises(ClaimRejected) as raised:
        allocated_devices(broken, REF, DRIVER)
    assert message in str(raised.value)


leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.lists(st.integers(), max_size=2)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a well-formed value, one time in eight garbage in its place."""
    return st.integers(0, 7).flatmap(lambda roll: leaf if roll == 0 else value)


def fields(**values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object whose fields are each present (maybe garbled) or missing."""
    return st.fixed_dictionaries(
        {}, optional={k: maybe(v) for k, v in values.items()}
    ) | st.fixed_dictionaries({k: maybe(v) for k, v in values.items()})


result = fields(
    request=st.sampled_from(["gpu", "gpu/sub"]),
    driver=st.sampled_from([DRIVER, "other.example.com"]),
    pool=st.just("n"),
    device=st.just("gpu-0"),
)
claims = fields(
    metadata=fields(uid=st.just(REF.uid)),
    status=fields(allocation=fields(devices=fields(results=st.lists(maybe(result), max_size=3)))),
)


@given(claims)
def test_any_claim_shaped_json_yields_devices_or_a_clear_rejection(document: dict[str, Any]) -> None:
    try:
        devices = allocated_devices(document, REF, DRIVER)
    except ClaimRejected as rejected:
        assert str(rejected)
    else:
        assert all(isinstance(device, AllocatedDevice) for device in devices)


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "request": st.sampled_from(["a", "b/c"]),
                "driver": st.sampled_from([DRIVER, "other.example.com"]),
                "pool": st.just("n"),
                "device": st.sampled_from(["gpu-0", "gpu-1"]),
            }
        ),
        max_size=6,
    )
)
def test_results_keep_their_order_and_only_ours(results: list[dict[str, str]]) -> None:
    devices = allocated_devices(claim(copy.deepcopy(results)), REF, DRIVER)
    assert [d.device for d in devices] == [r["device"] for r in results if r["driver"] == DRIVER]


def test_a_non_object_claim_is_rejected() -> None:
    with pytest.raises(ClaimRejected, match="not an object"):
        allocated_devices(["claim"], REF, DRIVER)
