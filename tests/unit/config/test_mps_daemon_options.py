"""The agent's options for where MPS control daemons run (--mps-daemons and what pods need)."""

import argparse

import pytest

from dra_driver.config.option_table import AGENT_OPTIONS, add_agent_switches, add_options
from dra_driver.config.settings import NodeSettings, SettingsError, node_settings

_VARIABLES = (
    "DRA_DRIVER_MPS_DAEMONS",
    "DRA_DRIVER_MPS_DAEMON_IMAGE",
    "POD_NAMESPACE",
    "DRA_DRIVER_MPS_START_TIMEOUT",
)


def settings_from(*argv: str) -> NodeSettings:
    parser = argparse.ArgumentParser()
    add_options(parser, AGENT_OPTIONS)
    add_agent_switches(parser)
    return node_settings(parser.parse_args(["--node-name", "node-a", *argv]), stderr_is_terminal=False)


@pytest.fixture(autouse=True)
def _no_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_by_default_daemons_are_processes_of_the_agent() -> None:
    settings = settings_from()
    assert (settings.mps_daemons, settings.mps_daemon_image, settings.namespace) == ("process", None, None)
    assert settings.mps_start_timeout == 60.0


def test_pods_take_the_image_and_namespace_from_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings_from("--mps-daemons", "pod", "--mps-daemon-image", "r/d:1", "--namespace", "gpu")
    assert (settings.mps_daemons, settings.mps_daemon_image, settings.namespace) == ("pod", "r/d:1", "gpu")
    monkeypatch.setenv("DRA_DRIVER_MPS_DAEMONS", "pod")
    monkeypatch.setenv("DRA_DRIVER_MPS_DAEMON_IMAGE", "r/d:2")
    monkeypatch.setenv("POD_NAMESPACE", "ns")
    monkeypatch.setenv("DRA_DRIVER_MPS_START_TIMEOUT", "5")
    settings = settings_from()
    assert (settings.mps_daemon_image, settings.namespace, settings.mps_start_timeout) == ("r/d:2", "ns", 5.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--mps-daemons", "container"],
            r"^--mps-daemons \(DRA_DRIVER_MPS_DAEMONS\): 'container' must be 'process'",
        ),
        (
            ["--mps-daemons", "pod", "--namespace", "gpu"],
            r"^--mps-daemon-image \(DRA_DRIVER_MPS_DAEMON_IMAGE\): must be set",
        ),
        (["--mps-daemons", "pod", "--mps-daemon-image", "i"], r"^--namespace \(POD_NAMESPACE\): must be set"),
        (["--namespace", "Not_A_Label"], r"^--namespace \(POD_NAMESPACE\): "),
        (
            ["--mps-start-timeout", "9000"],
            r"^--mps-start-timeout \(DRA_DRIVER_MPS_START_TIMEOUT\): '9000' must be",
        ),
    ],
)
def test_bad_daemon_options_are_refused_naming_the_option(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as refused:
        settings_from(*argv)
    assert "\n" not in str(refused.value)
