"""Which kubeconfig an operator's command uses, found the way kubectl finds it.

`--kubeconfig`, else the `KUBECONFIG` list, else `~/.kube/config`, else the pod's service account.
kubectl merges every file of a `KUBECONFIG` list; a command here reads one file, so it takes the
first that exists and says so when the list held more than one.
"""

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from dra_driver.base.errors import OperatorFault


class KubeconfigUnusable(OperatorFault, ValueError):
    """No kubeconfig can be used; the message names the flag or variable, so a command's option
    layer passes it on as its own invalid-option line (exit 2)."""


class KubeconfigChoice(msgspec.Struct, frozen=True):
    # None: the in-cluster service account.
    path: Path | None
    # One line for the operator when the choice is not the obvious one; empty otherwise.
    note: str = ""


def choose_kubeconfig(flag: str | None, environ: Mapping[str, str], home: Path) -> KubeconfigChoice:
    """Raises KubeconfigUnusable naming the flag or variable when what it names cannot be used, or
    when there is no kubeconfig and no cluster to run in."""
    if flag:
        if not Path(flag).is_file():
            raise KubeconfigUnusable(f"--kubeconfig: {flag} is not a file")
        return KubeconfigChoice(Path(flag))
    listed = [entry for entry in environ.get("KUBECONFIG", "").split(os.pathsep) if entry]
    if listed:
        existing = [Path(entry) for entry in listed if Path(entry).is_file()]
        if not existing:
            raise KubeconfigUnusable(f"KUBECONFIG: none of {', '.join(listed)} is a file")
        note = (
            f"using {existing[0]}, the first existing file of KUBECONFIG (kubectl would merge all "
            f"{len(listed)}; this command reads only that one)"
            if len(listed) > 1
            else ""
        )
        return KubeconfigChoice(existing[0], note)
    default = home / ".kube" / "config"
    if default.is_file():
        return KubeconfigChoice(default)
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return KubeconfigChoice(None, "no kubeconfig found: using the pod's service account")
    raise KubeconfigUnusable(
        f"--kubeconfig: not given, KUBECONFIG is not set and {default} does not exist, "
        "and this is not a pod (no KUBERNETES_SERVICE_HOST)"
    )
