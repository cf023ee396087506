#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): on a machine with an NVIDIA GPU, Python 3.12, PyTorch and no
# cluster, installs the wheels built by hack/gpu-check/wheelhouse.sh (no index, no internet) and
# runs `python -m tests.support.gpu_check`, which writes report.txt and report.json to OUT.
#
# It only reads the GPU and runs workloads on it: it never changes compute mode, MIG mode, clocks
# or persistence (tests/unit/support/test_gpu_check_sources.py keeps GPU setters out of it).
#
# usage: hack/gpu-check/run.sh --wheels DIR --out DIR [--hami-core-source DIR] [check options]
set -euo pipefail

usage() { echo "usage: $0 --wheels DIR --out DIR [--hami-core-source DIR] [check options]" >&2; exit 2; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3}
wheels=""
out=""
passed=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --wheels) [[ $# -ge 2 ]] || usage; wheels=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || usage; out=$2; passed+=(--out "$2"); shift 2 ;;
    *) passed+=("$1"); shift ;;
  esac
done
[[ -n $wheels && -n $out ]] || usage
shopt -s nullglob
found=("$wheels"/*.whl)
[[ ${#found[@]} -gt 0 ]] || { echo "--wheels $wheels: no .whl files there (hack/gpu-check/wheelhouse.sh)" >&2; exit 2; }

mkdir -p "$out"
site=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
trap 'rm -rf "$site"' EXIT
timeout 120 "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "${found[@]}"
# Five minutes in all: the check keeps its own deadline below this one.
cd "$repo"
PYTHONPATH="$site:$repo" timeout 300 "$python" -m tests.support.gpu_check "${passed[@]}"
