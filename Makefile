# Everything runs from a local virtual environment, created on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo dist test test-deps lint unit bench bench-cluster bench-pod-start bench-go-driver protos chart-schema clean mock-nvml gpu-check cluster cluster-down e2e cluster-build

# A test that needs podman fails instead of skipping where podman is missing.
export DRA_DRIVER_REQUIRE_PODMAN ?= 1
# The local cluster's Kubernetes minor (make e2e E2E_KUBERNETES=1.34); empty: the newest.
export E2E_KUBERNETES

$(INSTALLED): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# Helm 4 as a library, for tests/api/test_helm_chart.py and hack/kind-up.sh; the wheel says
	# Python >= 3.12 but works on 3.11.
	$(BIN)/pip install --quiet --ignore-requires-python helm-sdkpy==0.1.32
	touch $@

## demo: prepare a sample claim on a simulated node, no cluster needed
demo: $(INSTALLED)
	$(BIN)/dra-driver demo

## dist: the CLI's wheel and sdist in $(DIST) (what a release uploads to PyPI), built by PyPA's
## `build` in a virtual environment of its own: nothing of the test extra is needed
DIST ?= dist
BUILD_VENV := .build-venv
$(BUILD_VENV)/bin/pyproject-build:
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install --quiet 'build>=1.2,<2'

dist: $(BUILD_VENV)/bin/pyproject-build
	rm -rf $(DIST)
	$(BUILD_VENV)/bin/pyproject-build --outdir $(DIST) .

## test: install missing system packages (as root), lint, type-check and run every test tier
test: test-deps lint
	$(BIN)/python -m pytest

## test-deps: the system packages the tests need (podman, shellcheck, gcc, ...), installed as root
test-deps:
	PYTHON=$(PYTHON) hack/install-test-deps.sh

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## cluster: a real single-node Kubernetes (E2E_KUBERNETES=1.34|1.37, default 1.37) from upstream
## modules, as processes on loopback, with the driver installed by its chart (docs/e2e.md); as root
cluster: test-deps $(INSTALLED)
	$(BIN)/python -m tests.cluster up

## cluster-down: stop the local cluster and remove everything it made
cluster-down: $(INSTALLED)
	$(BIN)/python -m tests.cluster down

## cluster-build: only build (or find in the cache) the cluster's upstream components
cluster-build: $(INSTALLED)
	$(BIN)/python -m tests.cluster.build

## e2e: the e2e suite on the local cluster: up, tests/e2e, down (nothing left behind); as root
e2e: test-deps $(INSTALLED)
	$(BIN)/python -m tests.cluster.e2e

## unit: the fast tier only (pure cores, no processes)
unit: $(INSTALLED)
	$(BIN)/python -m pytest tests/unit

## bench: latency and memory benchmarks; results go to docs/bench/
bench: $(INSTALLED)
	$(BIN)/python -m tests.bench.prepare_latency --rounds 2000 --runs 2 --output docs/bench/prepare-latency.json
	$(BIN)/python -m tests.bench.device_model --rounds 200 --runs 2 --output docs/bench/device-model.json
	$(BIN)/python -m tests.bench.slice_publish --runs 2 --output docs/bench/slice-publish.json
	$(BIN)/python -m tests.bench.memory --rounds 500 --runs 2 --variant plain:PYTHONOPTIMIZE=0 --output docs/bench/memory.json
	$(BIN)/python -m tests.bench.claim_get --reps 6 --calls 1500 --output docs/bench/claim-get.json
	$(BIN)/python -m tests.bench.agent_instructions --runs 2 --output docs/bench/agent-instructions.json
	$(BIN)/python -m tests.bench.nvml_discovery --rounds 100 --output docs/bench/nvml-discovery.json
	$(BIN)/python -m tests.bench.usage_sampling --rounds 3000 --output docs/bench/usage-sampling.json
	$(BIN)/python -m tests.bench.share_scale --output docs/bench/share-scale.json
	$(BIN)/pip install --quiet -e '.[plot]'
	$(BIN)/python -m tests.bench.packing --output docs/bench/packing.json

## bench-cluster: the cluster-scale benchmark (docs/benchmarks.md, "Cluster scale"): the real
## scheduler and controllers over 100 and 500 kwok nodes whose slices the agent's controller
## publishes; builds kwok and the control plane when the cache lacks them; as root, hours (dynamic
## MIG alone is 20 minutes a replay at 100 nodes: docs/benchmarks.md, "Cluster scale")
bench-cluster: test-deps $(INSTALLED)
	$(BIN)/pip install --quiet -e '.[plot]'
	$(BIN)/python -m tests.bench.cluster_scale --output docs/bench/cluster-utilization.json

## bench-pod-start: pod created -> Running on the real local cluster, for the agent as it ships
## and with each hand-built hot-path piece in its plain form (docs/benchmarks.md, "Pod start on
## the real cluster"); builds the cluster's components when the cache lacks them; as root, ~20 min
bench-pod-start: test-deps $(INSTALLED)
	$(BIN)/python -m tests.bench.pod_start --pods 8 --rounds 2 --output docs/bench/pod-start.json

## bench-go-driver: pod start of our driver beside dra-example-driver and upstream's Go DRA test
## driver on the local cluster (docs/benchmarks.md, "Side by side with the Go drivers"); builds
## both; brings the cluster up and down unless it is up; as root, about 7 minutes warm
bench-go-driver: test-deps $(INSTALLED)
	$(BIN)/python -m tests.bench.pod_start.go_driver --pods 8 --rounds 2 --output docs/bench/go-driver.json

## mock-nvml: build the mock libnvidia-ml.so.1 the NVML tests load (the tests build it too)
MOCK_NVML := build/mock-nvml/libnvidia-ml.so.1
mock-nvml: $(MOCK_NVML)
$(MOCK_NVML): tests/mock_nvml/mock_nvml.c
	mkdir -p $(dir $@)
	cc -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lpthread

## gpu-check: on a machine with an NVIDIA GPU and no cluster, the checks of docs/gpu-check.md
## (wheels from hack/gpu-check/wheelhouse.sh in .gpu-check/wheels, HAMi-core's source optionally
## in .gpu-check/hami); no virtual environment: it installs the wheels itself
GPU_CHECK_DIR ?= .gpu-check
gpu-check:
	PYTHON=$(PYTHON) hack/gpu-check/run.sh --wheels $(GPU_CHECK_DIR)/wheels --out $(GPU_CHECK_DIR)/out \
		$(if $(wildcard $(GPU_CHECK_DIR)/hami/CMakeLists.txt),--hami-core-source $(GPU_CHECK_DIR)/hami)

## protos: regenerate dra_driver/_proto from api/kubelet
protos: $(INSTALLED)
	PYTHON=$(BIN)/python hack/gen-protos.sh

## chart-schema: regenerate the decoder- and catalog-derived parts of the chart's values.schema.json
chart-schema: $(INSTALLED)
	$(BIN)/python hack/gen-chart-schema.py

clean:
	rm -rf $(VENV) $(BUILD_VENV) dist .pytest_cache .mypy_cache .ruff_cache .hypothesis .import_linter_cache
