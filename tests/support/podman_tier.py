"""The node tier's one rule about podman: skipped where it cannot run, unless CI insists."""

import os

import pytest

from dra_driver.tools import podman


def require_podman() -> None:
    """Skips the calling test where podman cannot run here; fails it instead when
    DRA_DRIVER_REQUIRE_PODMAN=1 (CI), so a missing install step cannot pass as a skip."""
    problem = podman.podman_problem()
    if problem is None:
        return
    if os.environ.get("DRA_DRIVER_REQUIRE_PODMAN") == "1":
        pytest.fail(f"DRA_DRIVER_REQUIRE_PODMAN=1 but {problem}")
    pytest.skip(problem)
