"""dra-driver: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dra-driver")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

DEFAULT_DRIVER_NAME = "gpu.dra-driver.dev"
