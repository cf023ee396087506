#!/usr/bin/env bash
# The wheels hack/gpu-check/run.sh installs on a GPU machine without internet: the project's
# runtime dependencies (pyproject.toml's [project] dependencies) and what the check itself runs
# on (the stand-in API server's aiohttp, kubernetes-validate and jsonschema; pytest and hypothesis
# for the NVML contract suite), for CPython 3.12 on manylinux x86_64. Versions come from
# pyproject.toml, so the wheelhouse follows it.
#
# usage: hack/gpu-check/wheelhouse.sh [--dry-run] DEST
#   --dry-run   print the pip command instead of running it
set -euo pipefail

usage() { echo "usage: $0 [--dry-run] DEST" >&2; exit 2; }
dry_run=0
if [[ ${1:-} == --dry-run ]]; then dry_run=1; shift; fi
[[ $# -eq 1 && -n $1 && $1 != -* ]] || usage
dest=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3}

# One requirement a line: every runtime dependency, and the test extras the check needs, by name.
mapfile -t requirements < <("$python" - "$repo/pyproject.toml" <<'PY'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = ("aiohttp", "kubernetes-validate", "jsonschema", "pytest", "hypothesis")
print(*project["dependencies"], sep="\n")
for requirement in project["optional-dependencies"]["test"]:
    if re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0] in wanted:
        print(requirement)
PY
)

command=(
  "$python" -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
  --dest "$dest" "${requirements[@]}"
)
if [[ $dry_run == 1 ]]; then
  printf '%q ' "${command[@]}"; echo
  exit 0
fi
mkdir -p "$dest"
"${command[@]}"
