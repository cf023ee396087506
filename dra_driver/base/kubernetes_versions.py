"""The Kubernetes versions this release supports, in one place.

Every command's `--kubernetes-version`, the chart's `kubeVersion` and the docs read these (a test
holds the chart and the docs to them). The range is what the driver is tested on: the oldest
with `resource.k8s.io/v1`, up to the newest the e2e suite runs. A version outside it is refused
rather than guessed at: the slice layout, the admission policies and the feature gates all
differ by version, and a newer release of Kubernetes is a new row in tests/cluster/versions.py.

One default for every command: the oldest. What a command renders for it (manifests, classes,
slices) works on every supported cluster; a newer target is asked for by name.
"""

import re

OLDEST_MINOR = 34
NEWEST_MINOR = 37
DEFAULT_KUBERNETES = f"1.{OLDEST_MINOR}"
SUPPORTED_RANGE = f"1.{OLDEST_MINOR} to 1.{NEWEST_MINOR}"
_VERSION = re.compile(r"1\.(0|[1-9][0-9]*)")


def kubernetes_version_problem(text: str) -> str | None:
    """Why `text` is not a supported `MAJOR.MINOR`, or None."""
    if not _VERSION.fullmatch(text):
        return f"{text!r} is not a Kubernetes version MAJOR.MINOR, such as {DEFAULT_KUBERNETES}"
    if not OLDEST_MINOR <= int(text[2:]) <= NEWEST_MINOR:
        return f"{text} is not supported: this release supports Kubernetes {SUPPORTED_RANGE}"
    return None


def minor_of(text: str) -> tuple[int, int]:
    """(1, N) of a version kubernetes_version_problem accepted."""
    return 1, int(text.partition(".")[2])
