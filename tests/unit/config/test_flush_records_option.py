"""--flush-records: whether the agent's claim records are flushed to disk before kubelet's answer."""

import argparse
from pathlib import Path

import pytest

from dra_driver.agent.claim_serving import claim_record_store
from dra_driver.config.option_table import AGENT_OPTIONS, add_agent_switches, add_options
from dra_driver.config.settings import NodeSettings, SettingsError, node_settings


def settings_from(tmp_path: Path, *argv: str) -> NodeSettings:
    parser = argparse.ArgumentParser()
    add_options(parser, AGENT_OPTIONS)
    add_agent_switches(parser)
    arguments = ["--node-name", "node-a", "--state-dir", str(tmp_path), *argv]
    return node_settings(parser.parse_args(arguments), stderr_is_terminal=False)


@pytest.fixture(autouse=True)
def _no_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRA_DRIVER_FLUSH_RECORDS", raising=False)


def test_records_are_not_flushed_unless_asked(tmp_path: Path) -> None:
    settings = settings_from(tmp_path)
    assert settings.flush_records is False
    assert claim_record_store(settings).flushes is False


def test_the_flag_or_the_variable_turns_flushing_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert claim_record_store(settings_from(tmp_path, "--flush-records", "true")).flushes is True
    monkeypatch.setenv("DRA_DRIVER_FLUSH_RECORDS", "yes")
    assert settings_from(tmp_path).flush_records is True
    assert settings_from(tmp_path, "--flush-records", "false").flush_records is False


def test_a_value_that_is_no_yes_or_no_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError, match=r"^--flush-records \(DRA_DRIVER_FLUSH_RECORDS\): 'sometimes' must be"
    ):
        settings_from(tmp_path, "--flush-records", "sometimes")
