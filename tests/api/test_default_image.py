"""The default image is the one the documented build makes.

An install from a checkout must not name an image that does not exist (issue 20), so the
repository's default is the locally built one; the chart a release publishes names the released
image instead (tests/api/test_release.py). The build command is documented once, in the Dockerfile's
header, and docs/install.md and the README's quick start copy it; `dra-driver manifests`,
deploy/dra-driver.yaml and the chart's values must name exactly the tag it gives, and the chart's
versions must be the package's.
"""

import re
from pathlib import Path

import yaml

from dra_driver import __version__
from dra_driver.tools.manifests import DEFAULT_IMAGE, ManifestOptions, render

REPOSITORY = Path(__file__).resolve().parents[2]
CHART = REPOSITORY / "deploy" / "helm" / "dra-driver"
# `docker build -t <tag> .` or `podman build -t <tag> .` in a comment line.
BUILD = re.compile(r"\b(docker|podman) build -t (\S+) \.(?=\s|\)|$)")


def documented_build_tags(dockerfile: str) -> dict[str, str]:
    """The tag of each build command in the comment lines that head the Dockerfile."""
    header = []
    for line in dockerfile.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return dict(BUILD.findall("\n".join(header)))


def chart_default_image() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = values["image"]
    # The daemonset template's rule: an empty tag means the chart's appVersion.
    return f"{image['repository']}:{image['tag'] or chart['appVersion']}"


def committed_manifest_image() -> str:
    documents = yaml.safe_load_all((REPOSITORY / "deploy" / "dra-driver.yaml").read_text())
    (daemon_set,) = [item for item in documents if item["kind"] == "DaemonSet"]
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    image: str = container["image"]
    return image


def test_the_documented_build_tags_the_default_image() -> None:
    tags = documented_build_tags((REPOSITORY / "Dockerfile").read_text())

    assert tags == {"docker": f"dra-driver:{__version__}", "podman": f"dra-driver:{__version__}"}
    assert (DEFAULT_IMAGE, chart_default_image(), committed_manifest_image()) == (tags["docker"],) * 3


def test_the_rendered_default_pulls_only_when_missing() -> None:
    """A locally built or loaded image must be used as it is, never re-pulled."""
    (daemon_set,) = [item for item in render(ManifestOptions()) if item["kind"] == "DaemonSet"]
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    assert (container["image"], container["imagePullPolicy"]) == (DEFAULT_IMAGE, "IfNotPresent")
    assert values["image"]["pullPolicy"] == "IfNotPresent"


def test_the_chart_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())

    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)


def test_a_changed_build_tag_is_noticed() -> None:
    """Guards the parsing above: a header naming another tag gives that tag, and a build command
    below the header (an instruction's comment) is not the documented one."""
    dockerfile = (
        "# Build: docker build -t registry.example.com/dra:9 .   (or: podman build -t x:1 .)\n"
        "FROM scratch\n"
        "# docker build -t elsewhere:2 .\n"
    )

    assert documented_build_tags(dockerfile) == {"docker": "registry.example.com/dra:9", "podman": "x:1"}
