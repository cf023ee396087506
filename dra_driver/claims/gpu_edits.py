"""What a container gets for one whole GPU, as CDI container edits (pure).

Real GPUs need their device node plus the control nodes every CUDA process opens; the
runtime hook is told to stay away (NVIDIA_VISIBLE_DEVICES=void) because CDI already did the
work. Simulated GPUs have no device nodes, so they get environment variables that describe
exactly what was allocated, which is what tests and the demo check from inside a container.
"""

from dra_driver.claims.cdi import ContainerEdits
from dra_driver.hardware.model import Gpu

NODE_WIDE_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def device_env_prefix(device_name: str) -> str:
    return "DRA_DEVICE_" + device_name.upper().replace("-", "_")


def _describing_env(device_name: str, gpu: Gpu) -> tuple[str, ...]:
    prefix = device_env_prefix(device_name)
    return (f"{prefix}={gpu.uuid}", f"{prefix}_PRODUCT_NAME={gpu.product_name}")


def simulated_gpu_edits(device_name: str, gpu: Gpu) -> ContainerEdits:
    return ContainerEdits(env=_describing_env(device_name, gpu))


def nvml_gpu_edits(device_name: str, gpu: Gpu) -> ContainerEdits:
    return ContainerEdits(
        env=("NVIDIA_VISIBLE_DEVICES=void", *_describing_env(device_name, gpu)),
        device_nodes=(f"/dev/nvidia{gpu.minor}", *NODE_WIDE_DEVICE_NODES),
    )
