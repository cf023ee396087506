#!/usr/bin/env bash
# Regenerates the Python modules for the gRPC contracts into dra_driver/_proto (or into the
# directory given as $1, which the staleness test uses): the kubelet's in api/kubelet, and the
# standard gRPC health service in api/grpc/health. Each proto root is mapped to a package path
# so that generated imports read "dra_driver._proto....".
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_root=${1:-$repo_root}
python=${PYTHON:-python3}

# <proto root>=<package path it is generated into>
roots=(
  "api/kubelet=dra_driver/_proto"
  "api/grpc/health=dra_driver/_proto/grpc_health"
)

cd "$repo_root"
includes=()
protos=()
for root in "${roots[@]}"; do
  source_dir=${root%%=*}
  package_dir=${root#*=}
  includes+=("-I${package_dir}=${source_dir}")
  mapfile -t -O "${#protos[@]}" protos < <(cd "$source_dir" && find . -name '*.proto' | sort | sed "s|^\./|${package_dir}/|")
done

rm -rf "${out_root}/dra_driver/_proto"
mkdir -p "${out_root}/dra_driver/_proto"
"$python" -m grpc_tools.protoc \
  "${includes[@]}" \
  --python_out="$out_root" --pyi_out="$out_root" --grpc_python_out="$out_root" \
  "${protos[@]}"

# Every generated directory becomes a package.
find "${out_root}/dra_driver/_proto" -type d -exec touch {}/__init__.py \;
