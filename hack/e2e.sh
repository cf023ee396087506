#!/usr/bin/env bash
# The kind e2e tests (docs/e2e.md): brings the cluster up with hack/kind-up.sh (which reuses a
# running one and rolls out changed code), then runs the examples in deploy/examples on it with
# pytest tests/e2e. Arguments go to pytest, e.g. hack/e2e.sh -k vgpu -x.
#   E2E_SKIP_KIND_UP=1  use the cluster as it is (no image build)
#   KIND_CLUSTER_NAME, KIND_NODE_IMAGE, KIND_CONFIG, PYTHON: as for hack/kind-up.sh
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$repo_root/.venv/bin/python}

if [ "${E2E_SKIP_KIND_UP:-0}" != 1 ]; then
  "$repo_root/hack/kind-up.sh"
fi

export E2E_KUBE_CONTEXT="kind-${KIND_CLUSTER_NAME:-dra-driver}"
cd "$repo_root"
exec "$python" -m pytest tests/e2e "$@"
