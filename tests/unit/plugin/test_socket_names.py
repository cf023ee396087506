"""Socket names of one agent pod: fixed without a pod UID, UID-suffixed for rolling updates, and
always short enough for a unix socket address, whatever the driver name and directory."""

import re
from pathlib import Path

import pytest

from dra_driver.config.option_table import POD_UID
from dra_driver.config.settings import SettingsError
from dra_driver.plugin.sockets import (
    DRA_SOCKETS_PATTERN,
    MAX_SOCKET_PATH_BYTES,
    dra_socket_name,
    registration_socket_path,
    registration_sockets_pattern,
    socket_path_problem,
)

POD = "3c9d2f4e-8a1b-4c6d-9e0f-1a2b3c4d5e6f"
OTHER_POD = "7e6d5c4b-3a29-4817-8695-a4b3c2d1e0f9"
REGISTRY = Path("/var/lib/kubelet/plugins_registry")


def test_without_a_pod_uid_the_names_are_the_kubelet_defaults() -> None:
    assert (
        registration_socket_path(REGISTRY, "gpu.dra-driver.dev", None)
        == REGISTRY / "gpu.dra-driver.dev-reg.sock"
    )
    assert dra_socket_name(None) == "dra.sock"


def test_with_a_pod_uid_each_pod_gets_its_own_names() -> None:
    assert registration_socket_path(REGISTRY, "gpu.dra-driver.dev", POD) == (
        REGISTRY / f"gpu.dra-driver.dev-{POD}-reg.sock"
    )
    assert dra_socket_name(POD) == f"dra-{POD}.sock"
    assert registration_socket_path(REGISTRY, "gpu.dra-driver.dev", POD) != registration_socket_path(
        REGISTRY, "gpu.dra-driver.dev", OTHER_POD
    )


@pytest.mark.parametrize("driver_length", [40, 63])
def test_a_long_driver_name_falls_back_to_hashed_names_that_still_differ_per_pod(driver_length: int) -> None:
    driver = ("d" * (driver_length - 4)) + ".dev"
    mine = registration_socket_path(REGISTRY, driver, POD)
    other = registration_socket_path(REGISTRY, driver, OTHER_POD)
    assert socket_path_problem(mine) is None and len(str(mine).encode()) <= MAX_SOCKET_PATH_BYTES
    assert POD not in mine.name and mine != other
    assert mine.name.endswith("-reg.sock")


def test_the_sweep_patterns_match_our_names_and_no_one_elses() -> None:
    ours = re.compile(registration_sockets_pattern("gpu.dra-driver.dev"))
    for uid in (None, POD):
        assert ours.fullmatch(registration_socket_path(REGISTRY, "gpu.dra-driver.dev", uid).name)
    driver = "g" * 36 + ".dev"  # too long for the UID in the name, short enough for its hash
    hashed = registration_socket_path(REGISTRY, driver, POD).name
    assert POD not in hashed and re.fullmatch(registration_sockets_pattern(driver), hashed)
    for foreign in ("gpu.dra-driver.dev-other-reg.sock", "gpu.example.com-reg.sock", "csi.sock"):
        assert not ours.fullmatch(foreign), foreign
    dra = re.compile(DRA_SOCKETS_PATTERN)
    assert dra.fullmatch("dra.sock") and dra.fullmatch(dra_socket_name(POD))
    assert not dra.fullmatch("dra-../x.sock") and not dra.fullmatch("other.sock")


def test_a_pod_uid_that_is_not_a_uid_is_refused() -> None:
    assert POD_UID.check(POD) == POD and POD_UID.check("") is None
    with pytest.raises(SettingsError, match="--pod-uid"):
        POD_UID.check("x/../y")
