#!/usr/bin/env bash
# Regenerates the Python modules for the kubelet gRPC contracts in api/kubelet into
# dra_driver/_proto (or into the directory given as $1, which the staleness test uses).
# The proto path is mapped so that generated imports read "dra_driver._proto....".
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_root=${1:-$repo_root}
python=${PYTHON:-python3}

cd "$repo_root"
mapfile -t protos < <(cd api/kubelet && find . -name '*.proto' | sort | sed 's|^\./|dra_driver/_proto/|')

rm -rf "${out_root}/dra_driver/_proto"
mkdir -p "${out_root}/dra_driver/_proto"
"$python" -m grpc_tools.protoc \
  -Idra_driver/_proto=api/kubelet \
  --python_out="$out_root" --pyi_out="$out_root" --grpc_python_out="$out_root" \
  "${protos[@]}"

# Every generated directory becomes a package.
find "${out_root}/dra_driver/_proto" -type d -exec touch {}/__init__.py \;
