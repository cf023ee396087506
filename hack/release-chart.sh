#!/usr/bin/env bash
# The chart as a release publishes it: a copy of deploy/helm/dra-driver in OUT_DIR/dra-driver
# whose version and appVersion are VERSION and whose default image is IMAGE (the repository the
# release pushed, tagged with appVersion), so `helm install oci://.../dra-driver --version
# VERSION` pulls the image of the same release. The chart in the repository keeps the locally
# built default (dra-driver:<version>), which a checkout can build.
#   hack/release-chart.sh 0.1.0 ghcr.io/example-org/dra-driver dist
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 VERSION IMAGE OUT_DIR" >&2
  exit 2
fi
version=$1
image=$2
out=$3
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
chart="$out/dra-driver"

mkdir -p "$out"
rm -rf "$chart"
cp -R "$repo_root/deploy/helm/dra-driver" "$chart"

# Each line must be there exactly once: a changed values.yaml or Chart.yaml fails the release
# rather than publishing a chart that names the wrong image or version.
replace() { # replace FILE PATTERN REPLACEMENT
  local count
  count=$(grep -c -- "$2" "$1" || true)
  if [ "$count" -ne 1 ]; then
    echo "$1: expected one line matching '$2', found $count" >&2
    exit 1
  fi
  sed -i "s|$2|$3|" "$1"
}
replace "$chart/Chart.yaml" '^version: .*$' "version: $version"
replace "$chart/Chart.yaml" '^appVersion: .*$' "appVersion: \"$version\""
replace "$chart/values.yaml" '^  repository: dra-driver$' "  repository: $image"
