#!/usr/bin/env bash
# Brings up the kind cluster of the e2e tests with the node agent on the mock NVIDIA driver
# (docs/e2e.md):
#   1. creates the cluster from hack/kind-config.yaml (DRA feature gates, CDI in containerd),
#      or reuses it when it exists;
#   2. builds the agent's image from the Dockerfile and loads it into the cluster's nodes;
#   3. builds the mock libnvidia-ml.so.1 (hack/e2e-node/mock-nvml.Dockerfile, on the agent's base
#      image) and unpacks the mock driver on each worker: a driver root under
#      /run/mock-nvidia/driver and the mock's node file for the simulated node of hack/e2e-node
#      (tests/e2e/mock_driver.py);
#   4. labels the worker(s) for the agent and installs the Helm chart deploy/helm/dra-driver for
#      them (helm upgrade --install: the helm CLI if there is one, else the Helm library from
#      .venv) with hardware nvml, driverRoot at the mock and the mock's environment in extraEnv;
#      the values are those of tests/e2e/deploy.py, which the API tests install;
#   5. waits for the DaemonSet's rollout and the node's ResourceSlices.
# Safe to run again: the image is tagged with its ID, so changed code rolls the agent out anew.
#
# Needs docker, kind (>= 0.30, or any with a Kubernetes >= 1.34 node image), kubectl, and the
# repository's .venv (`make lint` creates it, with the Helm library); the helm CLI is optional.
# Settings, from the environment:
#   KIND_CLUSTER_NAME  cluster name (default dra-driver)
#   KIND_NODE_IMAGE    node image, e.g. kindest/node:v1.35.0 (default: kind's own)
#   KIND_CONFIG        kind config file (default hack/kind-config.yaml)
#   PYTHON             Python with the package installed (default .venv/bin/python)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster=${KIND_CLUSTER_NAME:-dra-driver}
node_image=${KIND_NODE_IMAGE:-}
kind_config=${KIND_CONFIG:-$repo_root/hack/kind-config.yaml}
python=${PYTHON:-$repo_root/.venv/bin/python}
context="kind-$cluster"
# What the installation names: the agent's namespace, the release and its DaemonSet, and the
# worker label.
namespace=dra-driver
release=dra-driver
daemon_set=dra-driver
node_label=dra-driver.dev/e2e=true
driver=gpu.dra-driver.dev
minimum_minor=34

say() { printf 'kind-up: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || die "$tool is not installed (see docs/e2e.md)"
done
[ -x "$python" ] || die "$python not found: run 'make lint' to create .venv, or set PYTHON"
kube() { kubectl --context "$context" "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if kind get clusters | grep -qx "$cluster"; then
  say "reusing kind cluster $cluster"
else
  say "creating kind cluster $cluster"
  create=(create cluster --name "$cluster" --config "$kind_config" --wait 180s)
  if [ -n "$node_image" ]; then
    create+=(--image "$node_image")
  fi
  kind "${create[@]}"
fi

version=$(kube version -o json)
minor=$("$python" -c 'import json, sys; print(int(json.load(sys.stdin)["serverVersion"]["minor"].rstrip("+")))' <<<"$version")
if [ "$minor" -lt "$minimum_minor" ]; then
  die "the cluster runs Kubernetes 1.$minor; the driver needs 1.$minimum_minor or later (set KIND_NODE_IMAGE)"
fi

say "building the agent's image"
docker build --quiet --tag dra-driver:e2e "$repo_root" >/dev/null
image_id=$(docker image inspect --format '{{.Id}}' dra-driver:e2e)
digest=${image_id#sha256:}
image="dra-driver:e2e-${digest:0:12}"
docker tag dra-driver:e2e "$image"
say "loading $image into $cluster"
kind load docker-image "$image" --name "$cluster"

mapfile -t workers < <(kube get nodes --selector '!node-role.kubernetes.io/control-plane' --output name)
[ "${#workers[@]}" -gt 0 ] || die "the cluster has no worker node"

say "building the mock NVIDIA driver"
docker build --quiet --tag dra-driver-mock-nvml:e2e \
  --file "$repo_root/hack/e2e-node/mock-nvml.Dockerfile" "$repo_root/tests/mock_nvml" >/dev/null
docker run --rm dra-driver-mock-nvml:e2e cat /libnvidia-ml.so.1 >"$work/libnvidia-ml.so.1"
for worker in "${workers[@]}"; do
  # A kind node's container is named after the node.
  node=${worker#node/}
  say "unpacking the mock NVIDIA driver on $node"
  (cd "$repo_root" && "$python" -m tests.e2e.mock_driver archive --node-name "$node" \
    --library "$work/libnvidia-ml.so.1") | docker exec --interactive "$node" tar -x -f - -C /
done
kube label --overwrite "${workers[@]}" "$node_label"

say "installing the driver with the Helm chart"
kube create namespace "$namespace" --dry-run=client --output yaml | kube apply --filename - >/dev/null
kube label --overwrite namespace "$namespace" pod-security.kubernetes.io/enforce=privileged >/dev/null
# An installation applied without Helm (kind-up.sh before the chart) is not Helm's to take over,
# and its DaemonSet's selector cannot change: remove it, all but the namespace.
existing=$(kube get daemonset "$daemon_set" --namespace "$namespace" --ignore-not-found \
  --output 'jsonpath={.metadata.name}/{.metadata.labels.app\.kubernetes\.io/managed-by}')
if [ -n "$existing" ] && [ "$existing" != "$daemon_set/Helm" ]; then
  say "removing the installation made without Helm"
  (cd "$repo_root" && "$python" -m dra_driver manifests) | "$python" -c '
import sys, yaml
yaml.safe_dump_all([d for d in yaml.safe_load_all(sys.stdin) if d["kind"] != "Namespace"], sys.stdout)' |
    kube delete --ignore-not-found --filename -
fi
if command -v helm >/dev/null; then
  values=$work/values.json
  (cd "$repo_root" && "$python" -m tests.e2e.deploy values --image "$image") >"$values"
  helm upgrade --install "$release" "$repo_root/deploy/helm/dra-driver" \
    --kube-context "$context" --namespace "$namespace" --values "$values"
else
  (cd "$repo_root" && "$python" -m tests.e2e.deploy install --image "$image" --context "$context")
fi
kube rollout status --namespace "$namespace" "daemonset/$daemon_set" --timeout 180s

say "waiting for the agent's ResourceSlices"
for _ in $(seq 60); do
  if [ -n "$(kube get resourceslices --field-selector "spec.driver=$driver" --output name)" ]; then
    say "ready: kubectl --context $context get resourceslices"
    exit 0
  fi
  sleep 2
done
kube logs --namespace "$namespace" "daemonset/$daemon_set" --tail 50 >&2 || true
die "no ResourceSlices of $driver after 120s"
