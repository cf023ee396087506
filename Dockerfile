# The node agent's image: the package and its dependencies on a slim Python, nothing else.
# Build: docker build -t dra-driver:0.1.0 .   (or: podman build -t dra-driver:0.1.0 .)
#
# Wheels are built in a throwaway stage, so compilers and pip caches never reach the image.
FROM python:3.11-slim AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dra_driver ./dra_driver
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# util-linux: `unshare` for MPS daemons with a private /dev/shm.
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY --from=wheels /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels dra-driver \
 && rm -rf /wheels
# Docstrings and asserts left out of the loaded code: about 2 MiB of the agent's resident memory
# (docs/benchmarks.md); nothing reads a docstring or relies on an assert at run time.
ENV PYTHONOPTIMIZE=2
# Compiled bytecode, at that level, is part of the image, so the agent does not compile at every
# start.
RUN python -m compileall -q -o 2 /usr/local/lib/python3.11
ENTRYPOINT ["dra-driver"]
CMD ["node"]
