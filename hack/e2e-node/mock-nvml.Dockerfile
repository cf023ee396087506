# The mock libnvidia-ml.so.1 (tests/mock_nvml) for the kind e2e worker, built by hack/kind-up.sh
# against the C library of the agent's own base image, so the agent can load it whatever the host
# is. Test code only: the agent's image (the Dockerfile at the repository's root) never has it.
#   docker build --file hack/e2e-node/mock-nvml.Dockerfile tests/mock_nvml
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY mock_nvml.c /src/
# The flags of `make mock-nvml` (tests/api/test_kind_mock_driver.py keeps them equal).
RUN gcc -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -Wl,-soname,libnvidia-ml.so.1 -o /libnvidia-ml.so.1 /src/mock_nvml.c -lpthread
