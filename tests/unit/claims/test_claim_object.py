import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.claims.allocation import allocated_devices
from dra_driver.claims.claim_object import AllocatedDevice, Consumed, ResourceClaimView
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import claim_ref

REF = claim_ref("default", "c", "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17")
DRIVER = "gpu.dra-driver.dev"


def ours(document: object) -> tuple[AllocatedDevice, ...]:
    """What prepare takes from a claim: decoded, then checked against kubelet's request."""
    return allocated_devices(ResourceClaimView.decode(document, DRIVER), REF)


def claim(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": "c", "uid": REF.uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_only_our_results_are_kept_with_their_main_request() -> None:
    devices = ours(
        claim(
            [
                {"request": "gpu/big", "driver": DRIVER, "pool": "n", "device": "gpu-0"},
                {"request": "nic", "driver": "net.example.com", "pool": "n", "device": "eth0"},
            ]
        )
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
        ours(broken)
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
        devices = ours(document)
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
    devices = ours(claim(copy.deepcopy(results)))
    assert [d.device for d in devices] == [r["device"] for r in results if r["driver"] == DRIVER]


def test_a_non_object_claim_is_rejected() -> None:
    with pytest.raises(ClaimRejected, match=r"^the API server returned a list, not a ResourceClaim object$"):
        ResourceClaimView.decode(["claim"], DRIVER)


def test_a_re_created_claim_is_not_the_one_kubelet_asked_for() -> None:
    document = claim([])
    document["metadata"]["uid"] = "7d1c0f4e-2b3a-4c5d-8e9f-0a1b2c3d4e5f"

    with pytest.raises(ClaimRejected, match="the claim was deleted and re-created"):
        ours(document)


def test_the_view_keeps_what_its_readers_take() -> None:
    document = claim([])
    document["metadata"].update(
        generation=4, annotations={"resource.kubernetes.io/pod-claim-name": "gpus", "other": "x"}
    )

    view = ResourceClaimView.decode(document, DRIVER)

    assert (view.uid, view.generation, view.pod_claim_name, view.pod_claim_name_problem) == (
        REF.uid,
        4,
        "gpus",
        None,
    )
    assert view.allocated and view.json is document


@pytest.mark.parametrize("generation", [None, "4", True, 4.0])
def test_a_generation_that_is_no_integer_is_left_out(generation: object) -> None:
    document = claim([])
    document["metadata"]["generation"] = generation

    assert ResourceClaimView.decode(document, DRIVER).generation is None


def test_a_bad_pod_claim_name_is_kept_as_a_problem_for_a_new_prepare_to_refuse() -> None:
    document = claim([])
    document["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "../x"}

    view = ResourceClaimView.decode(document, DRIVER)

    assert view.pod_claim_name is None
    assert str(view.pod_claim_name_problem).startswith(
        "metadata.annotations['resource.kubernetes.io/pod-claim-name']: '../x' is not a DNS label"
    )


def test_consumed_capacity_is_decoded_into_bytes_and_percent() -> None:
    share_id = "5e0a7c1b-3d2f-4e6a-9b8c-7d6e5f4a3b2c"
    (device,) = ours(
        claim(
            [
                {
                    "request": "vgpu",
                    "driver": DRIVER,
                    "pool": "n",
                    "device": "gpu-0",
                    "shareID": share_id,
                    "consumedCapacity": {"memory": "10Gi", "cores": "30", "example.com/x": "1"},
                }
            ]
        )
    )

    assert device.memory == Consumed(10 * 2**30, "10Gi")
    assert device.cores == Consumed(30, "30")
    assert device.consumed_names == ("memory", "cores", "example.com/x")
    assert device.share_id == share_id


RESULT = "status.allocation.devices.results[0]"


@pytest.mark.parametrize(
    ("consumed", "message"),
    [
        (["10Gi"], f"{RESULT}.consumedCapacity: expected an object, got a list"),
        ({"cores": 50}, f"{RESULT}.consumedCapacity.cores: expected a quantity string, got the integer 50"),
        (
            {"cores": "500m"},
            f'{RESULT}.consumedCapacity.cores: "500m" is not a whole percentage such as "50"',
        ),
        ({"memory": "1.5Gi"}, f'{RESULT}.consumedCapacity.memory: "1.5Gi" has a fraction'),
        ({"memory": "lots"}, f'{RESULT}.consumedCapacity.memory: "lots" is not a whole number of bytes'),
    ],
)
def test_malformed_consumed_capacity_is_refused_naming_the_field(consumed: object, message: str) -> None:
    result = {
        "request": "vgpu",
        "driver": DRIVER,
        "pool": "n",
        "device": "gpu-0",
        "consumedCapacity": consumed,
    }

    with pytest.raises(ClaimRejected) as refused:
        ours(claim([result]))

    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("request_name", ["../escape", "gpu/../../x", "GPU", "a" * 64])
def test_a_request_name_that_cannot_be_a_path_component_rejects_the_claim(request_name: str) -> None:
    """Request names become file names (device_metadata): refused with the claim, before prepare
    does anything."""
    other = {"request": "nic", "driver": "net.example.com", "pool": "n", "device": "eth0"}
    result = {"request": request_name, "driver": DRIVER, "pool": "n", "device": "gpu-0"}

    with pytest.raises(ClaimRejected, match=r"^status\.allocation\.devices\.results\[2\]\.request: "):
        ours(claim([other, other, result]))


def test_other_drivers_results_are_theirs_to_check() -> None:
    theirs = {"request": "nic", "driver": "net.example.com", "pool": 7, "consumedCapacity": {"cores": "1.5"}}

    assert ours(claim([theirs])) == ()
