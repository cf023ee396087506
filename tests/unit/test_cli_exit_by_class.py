"""A command that fails with a DriverError exits by the error's branch (cli.main): 2 and the
one line for the operator's invalid input, 1 and the one line for any other failure."""

import argparse

import pytest

from dra_driver import cli
from dra_driver.agent.errors import SetupError, StartupError
from dra_driver.base.errors import ClaimFault, DriverError, OperatorFault, TransientFault
from dra_driver.commands import faults
from dra_driver.config.option_values import SettingsError
from dra_driver.devices.node_config import NodeConfigError
from dra_driver.kube.errors import ApiError

ARGS = ["simulate-fault", "--state-dir", "/nonexistent", "--gpu", "0", "--xid", "79"]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (OperatorFault("--flag: a new operator fault"), 2),
        (SettingsError("--state-dir: not a directory"), 2),
        (SetupError("--hardware simulated:nope: unknown profile"), 2),
        (NodeConfigError("gpus[0].mode: unknown mode"), 2),
        (TransientFault("timed out"), 1),
        (StartupError("cannot reach the Kubernetes API"), 1),
        (ApiError("list resourceslices", 503, "ServiceUnavailable", "etcd is down"), 1),
        (ClaimFault("a claim's fault reaching a command"), 1),
        (DriverError("no branch"), 1),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_a_command_exits_by_its_errors_branch_with_one_line(
    error: DriverError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(faults, "run", fail)
    assert cli.main(ARGS) == code
    assert capsys.readouterr().err == f"dra-driver simulate-fault: {error}\n"


def test_an_error_outside_the_tree_is_not_taken_for_a_failure_the_driver_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug keeps its traceback: only a DriverError is worded as one line."""

    def fail(args: argparse.Namespace) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(faults, "run", fail)
    with pytest.raises(KeyError):
        cli.main(ARGS)
