"""dra-driver: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs."""

# The one place the version is written: pyproject.toml reads it from here. A literal, not
# importlib.metadata, which the agent would otherwise import for this alone (0.4-0.5 MiB).
__version__ = "0.1.0"

DEFAULT_DRIVER_NAME = "gpu.dra-driver.dev"
