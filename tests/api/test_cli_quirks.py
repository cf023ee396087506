"""What a user's first week tripped on in the CLI (issue 51): a value that starts with '-' was
taken for an option and answered with the usage, a count of one said "1 pods", and `inspect
--help` called a defaulted option required."""

import pytest

from dra_driver.cli import main


def test_a_value_that_starts_with_a_dash_reaches_its_own_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--node", "simulated:dgx-h100", "--pods", "-3xgpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith('dra-driver plan: --pods[0] "-3xgpu"'), err
    assert "usage:" not in err


def test_a_flag_after_a_valued_flag_is_still_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """`--pods --node ...` is a missing value, which argparse reports as before."""
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--pods", "--node", "simulated:dgx-h100"])
    assert exited.value.code == 2
    assert "--pods: expected one argument" in capsys.readouterr().err


def test_one_pod_is_one_pod(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--node", "simulated:dgx-h100", "--pods", "1xgpu"]) == 0
    assert "pods: 1xgpu (1 pod)\n" in capsys.readouterr().out


def test_inspect_help_does_not_call_the_node_name_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    assert "(required)" not in capsys.readouterr().out
