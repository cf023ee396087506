"""--host-driver-root: the driver root as the host sees it, which CDI specs name; by default the
same directory as --driver-root, which the agent reads."""

import argparse
from pathlib import Path

import pytest

from dra_driver.config.option_table import AGENT_OPTIONS, add_agent_switches, add_options
from dra_driver.config.settings import SettingsError, node_settings


def settings_from(*argv: str) -> Path:
    parser = argparse.ArgumentParser()
    add_options(parser, AGENT_OPTIONS)
    add_agent_switches(parser)
    return node_settings(
        parser.parse_args(["--node-name", "node-a", *argv]), stderr_is_terminal=False
    ).host_root


def test_by_default_the_host_sees_the_driver_root_where_the_agent_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DRA_DRIVER_HOST_ROOT", raising=False)
    monkeypatch.delenv("DRA_DRIVER_ROOT", raising=False)

    assert settings_from() == Path("/")
    assert settings_from("--driver-root", "/run/nvidia/driver") == Path("/run/nvidia/driver")


def test_in_a_pod_the_host_path_is_given_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRA_DRIVER_HOST_ROOT", raising=False)
    assert settings_from("--driver-root", "/driver-root", "--host-driver-root", "/run/nvidia/driver") == Path(
        "/run/nvidia/driver"
    )
    monkeypatch.setenv("DRA_DRIVER_ROOT", "/driver-root")
    monkeypatch.setenv("DRA_DRIVER_HOST_ROOT", "/run/nvidia/driver")
    assert settings_from() == Path("/run/nvidia/driver")


def test_a_relative_host_driver_root_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRA_DRIVER_HOST_ROOT", raising=False)
    with pytest.raises(
        SettingsError, match=r"--host-driver-root \(DRA_DRIVER_HOST_ROOT\): 'run/nvidia/driver'"
    ):
        settings_from("--host-driver-root", "run/nvidia/driver")
