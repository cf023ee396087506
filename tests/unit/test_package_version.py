"""The version is written once, in the package; the installed metadata and the agent agree."""

import importlib.metadata
import subprocess
import sys

from dra_driver import __version__


def test_the_installed_metadata_carries_the_packages_version() -> None:
    assert importlib.metadata.version("dra-driver") == __version__


def test_the_agent_never_imports_importlib_metadata() -> None:
    """It was imported for the version alone: 0.4-0.5 MiB of the agent's memory (issue 8)."""
    program = "import sys, dra_driver.agent.node_process; print('importlib.metadata' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr
