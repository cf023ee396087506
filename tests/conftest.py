"""Fixtures shared by the test tiers: the stand-in API server and short temporary directories,
and a check that no test leaves a simulated MPS daemon running."""

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate.utils
import pytest
import uvloop
from hypothesis import HealthCheck, settings
from kubernetes import client, config

from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.image import IMAGE_ENVIRONMENT
from tests.support.processes import process_alive, simulated_mps_daemons
from tests.support.publishing import add_node

# CI machines have two busy cores: wall-clock limits per example would only make tests flaky.
settings.register_profile("project", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("project")

# In-process tests run their coroutines on the loop every command runs on
# (dra_driver/commands/event_loop.py), so what they prove holds for the agent's loop.
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

# kubernetes-validate reads and parses the schema files (the definitions file is megabytes of JSON)
# on every call, and the stand-in API server validates every write: about 50 ms each, most of the
# time of tests that write many objects. The files never change while the tests run, and nothing
# mutates the parsed schemas, so each is read once per test process.
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


# How long a daemon told to quit just before a test ended may take to exit.
DAEMON_EXIT_SECONDS = 5.0


@pytest.fixture(scope="session")
def daemons_before_the_tests() -> set[int]:
    """Simulated MPS daemons already running when the tests started (another run's): not ours."""
    return simulated_mps_daemons()


@pytest.fixture(autouse=True)
def no_mps_daemon_left_running(daemons_before_the_tests: set[int]) -> Iterator[None]:
    """A simulated MPS daemon outlives the agent that started it, as a real one does, and once a
    test's directories are gone nothing ever tells it to quit: a test that leaves one running
    would leak a process on every run. Such a test fails here, and its daemons are killed."""
    yield
    left = simulated_mps_daemons() - daemons_before_the_tests
    deadline = time.monotonic() + DAEMON_EXIT_SECONDS
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {pid for pid in left if process_alive(pid)}
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):  # it may have exited just now
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the test left {len(left)} simulated MPS daemon(s) running (killed now): {sorted(left)}")


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    """With the agents' Node, which owns the slices they publish."""
    server = ApiServer().start()
    add_node(server)
    yield server
    server.stop()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """pytest's tmp_path can make unix socket paths longer than the 108-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="dra-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubeconfig(apiserver: ApiServer, short_dir: Path) -> Path:
    return apiserver.write_kubeconfig(short_dir / "kubeconfig")


@pytest.fixture
def claims_api(kubeconfig: Path) -> Iterator[client.ResourceV1Api]:
    api_client = config.new_client_from_config(str(kubeconfig))
    yield client.ResourceV1Api(api_client)
    api_client.close()


@pytest.fixture
def agent_dirs(short_dir: Path) -> AgentDirs:
    return AgentDirs(root=short_dir / "node")


@pytest.fixture
def agent(agent_dirs: AgentDirs, kubeconfig: Path) -> Iterator[AgentProcess]:
    process = start_agent(agent_dirs, kubeconfig, env=IMAGE_ENVIRONMENT)
    # Once its slices are published the agent is quiet, so faults a test injects hit its calls.
    process.wait_for_log("resourceslices published")
    yield process
    process.terminate()
