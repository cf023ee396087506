#!/usr/bin/env bash
# What a release publishes, from its tag and the repository's owner, as key=value lines for
# $GITHUB_OUTPUT (.github/workflows/release.yml); tests/api/test_release.py runs it too, so the
# chart's default image and the pushed image cannot drift apart.
#   hack/release-names.sh v0.1.0 Example-Org
#   version=0.1.0
#   image=ghcr.io/example-org/dra-driver
#   charts=oci://ghcr.io/example-org/charts
# The tag must be v<the package's version> (dra_driver/__init__.py): the image's package, the
# chart's appVersion and the tag then say the same.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 TAG OWNER" >&2
  exit 2
fi
tag=$1
owner=${2,,}
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
package_version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo_root/dra_driver/__init__.py")

if [ "$tag" != "v$package_version" ]; then
  echo "tag $tag: a release tag must be v$package_version, the version in dra_driver/__init__.py" >&2
  exit 2
fi
if ! [[ $owner =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]]; then
  echo "owner $2: not a GitHub account name" >&2
  exit 2
fi
echo "version=$package_version"
echo "image=ghcr.io/$owner/dra-driver"
echo "charts=oci://ghcr.io/$owner/charts"
