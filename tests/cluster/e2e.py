"""`make e2e`: the e2e suite (tests/e2e) on the local cluster, from nothing to nothing: it builds
what the cache lacks, brings the cluster up, runs pytest with the cluster's KUBECONFIG and
kubectl first on the PATH, tears the cluster down and fails if anything of it is left.

    python -m tests.cluster.e2e [pytest arguments]     (E2E_KUBERNETES=1.34 for the oldest)
    E2E_KEEP_CLUSTER=1: leave the cluster up afterwards (to look at a failure)
"""

import os
import subprocess
import sys
import time

from tests.cluster.layout import Layout
from tests.cluster.teardown import leftovers, tear_down
from tests.cluster.up import say, up
from tests.cluster.versions import kubernetes_version


def _environment(lines: list[str]) -> dict[str, str]:
    """The `export NAME=VALUE` lines applied to this process's environment."""
    env = dict(os.environ)
    for line in lines:
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = value.replace("$PATH", os.environ.get("PATH", ""))
    env.pop("E2E_KUBE_CONTEXT", None)
    env["E2E_PROVIDER"] = "local"
    return env


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        print("e2e: run as root: kubelet, containerd and runc need it", file=sys.stderr)
        return 1
    layout = Layout.from_environment()
    version = kubernetes_version()
    started = time.monotonic()
    try:
        lines = up(layout, version)
    except Exception:
        if not os.environ.get("E2E_KEEP_CLUSTER"):
            tear_down(layout)
        raise
    say(f"cluster up after {time.monotonic() - started:.0f}s; running tests/e2e")
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/e2e", *argv], env=_environment(lines), check=False
    )
    if os.environ.get("E2E_KEEP_CLUSTER"):
        say(f"left up (E2E_KEEP_CLUSTER): {'; '.join(lines)}")
        return tests.returncode
    tear_down(layout)
    left = leftovers(layout)
    if left:
        print(f"e2e: cluster-down left {len(left)} things behind: {', '.join(left)}", file=sys.stderr)
        return 1
    say(f"Kubernetes {version.release}: e2e finished in {time.monotonic() - started:.0f}s, torn down clean")
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
