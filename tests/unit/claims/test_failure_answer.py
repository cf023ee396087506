"""What kubelet hears of a failed claim is chosen by the error's branch (calls.failure_answer):
a claim fault as it is, anything else as an internal error that names its class."""

import pytest

from dra_driver.base.errors import ClaimFault, DriverError, OperatorFault, TransientFault
from dra_driver.base.strict_decode import DecodeError
from dra_driver.claims.calls import failure_answer
from dra_driver.claims.edits.cdi import InvalidCdiName
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import InvalidClaimIdentity
from dra_driver.claims.opaque_config import OpaqueConfigError
from dra_driver.hardware.model import HardwareError
from dra_driver.kube.errors import ApiError


class _NewClaimFault(ClaimFault):
    """A claim fault no list names: told as is because of its branch alone."""


@pytest.mark.parametrize(
    "error",
    [
        ClaimRejected("device gpu-0: taken"),
        OpaqueConfigError("config[0]: sharing: unknown strategy"),
        InvalidClaimIdentity("uid: not a UID"),
        InvalidCdiName("claim name: not a CDI name"),
        _NewClaimFault("what the claim asked for"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_claim_fault_is_told_to_kubelet_as_it_is(error: ClaimFault) -> None:
    assert failure_answer("prepare", error) == str(error)


@pytest.mark.parametrize(
    "error",
    [
        OperatorFault("--state-dir: not a directory"),
        TransientFault("the API server did not answer"),
        DriverError("no branch"),
        # A decoding error that no claim edge translated is not the claim's to hear.
        DecodeError("spec", "expected an object"),
        HardwareError("nvmlDeviceGetHandleByUUID: GPU is lost"),
        ApiError("get resourceclaim", 0, "", "connection refused"),
        KeyError("a bug"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_anything_else_is_an_internal_error_naming_its_class(error: Exception) -> None:
    assert (
        failure_answer("prepare", error) == f"internal error during prepare: {type(error).__name__}: {error}"
    )
