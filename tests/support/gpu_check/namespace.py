"""Runs a command under CDI edits (cdi_apply) on this host: reads the path facts, starts the
private mount namespace, and removes the mount points it had to create once the command is gone."""

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.gpu_check.cdi_apply import Edits, NamespacePlan, PathFact, plan_namespace


def host_fact(path: str) -> PathFact:
    if not os.path.lexists(path):
        return PathFact("missing")
    return PathFact("dir" if Path(path).is_dir() else "file", os.path.realpath(path))


@dataclass
class NamespaceRun:
    plan: NamespacePlan
    process: subprocess.Popen[str]

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Waits (killing the command past `timeout`), then removes the mount points made for it:
        the namespace, and its mounts, end with the command."""
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
            stderr += f"\nkilled after {timeout:.0f} s"
        finally:
            remove_created(self.plan.created)
        return self.process.returncode, stdout, stderr


def remove_created(paths: Sequence[str]) -> None:
    for path in paths:
        if Path(path).is_dir() and not Path(path).is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)


def start_under_edits(
    edits: Edits,
    command: Sequence[str],
    base_env: Mapping[str, str],
    extra_env: Mapping[str, str],
    empty_loader_cache: str | None = None,
) -> NamespaceRun:
    """`command` in a private mount namespace with `edits` applied; its environment is `base_env`,
    then the edits' variables, then `extra_env` (the workload's own parameters).
    `empty_loader_cache`: see cdi_apply."""
    plan = plan_namespace(edits, command, host_fact, empty_loader_cache)
    try:
        process = subprocess.Popen(
            plan.argv,
            env={**base_env, **plan.env, **extra_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except BaseException:
        remove_created(plan.created)
        raise
    return NamespaceRun(plan, process)
