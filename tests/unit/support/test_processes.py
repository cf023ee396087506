"""The check that no test leaves a simulated MPS daemon running (conftest.py) finds daemons by
their command lines: a daemon started the way the agent starts one is found while it runs, and
not once it has quit."""

import os
import subprocess
import sys
import time
from pathlib import Path

from dra_driver.hardware.simulated_mps_control import MODULE
from tests.support.processes import process_alive, simulated_mps_daemons


def test_a_running_daemon_is_found_and_one_that_quit_is_not(short_dir: Path) -> None:
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(short_dir / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(short_dir / "log"),
    }
    (short_dir / "pipe").mkdir()
    (short_dir / "log").mkdir()
    before = simulated_mps_daemons()
    subprocess.run([sys.executable, "-m", MODULE, "-d"], env=env, check=True, timeout=30)
    (daemon,) = simulated_mps_daemons() - before
    assert process_alive(daemon)

    # Told to quit the way the agent tells it: the program without -d, the command on stdin.
    command = subprocess.Popen([sys.executable, "-m", MODULE], env=env, stdin=subprocess.PIPE, text=True)
    command.communicate("quit\n", timeout=30)
    deadline = time.monotonic() + 10
    while process_alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not process_alive(daemon)
    assert simulated_mps_daemons() - before == set()
