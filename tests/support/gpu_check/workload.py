"""The CUDA workload the check runs under a claim's edits, as a plain script (it needs PyTorch,
nothing of this project). Parameters come from the environment; it prints one JSON object.

- GPU_CHECK_ALLOCATE=1: allocate 1 GiB blocks until an allocation fails (or the GPU's total is
  passed), report how many succeeded, then free them.
- GPU_CHECK_MATMUL_SECONDS=s: bf16 8192x8192 matmuls for s seconds, report TFLOP/s.
- GPU_CHECK_HOLD_GIB=n with GPU_CHECK_HOLD=prefix: hold n GiB, write <prefix>.ready, wait for
  <prefix>.go (at most GPU_CHECK_HOLD_SECONDS, default 60).

It always reports the driver libraries it has loaded (`driver_libraries`, from /proc/self/maps):
where its loader found them.
"""

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

GIB = 2**30
SIZE = 8192
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")


def driver_libraries() -> list[str]:
    """Paths of the driver's libraries mapped into this process, as its mount namespace names them."""
    paths = {line.split(maxsplit=5)[-1].strip() for line in Path("/proc/self/maps").read_text().splitlines()}
    return sorted(p for p in paths if p.rsplit("/", 1)[-1].startswith(DRIVER_LIBRARIES))


def allocate_until_failure(result: dict[str, Any]) -> None:
    _, total = torch.cuda.mem_get_info()
    blocks: list[torch.Tensor] = []
    error = None
    while len(blocks) <= total // GIB:
        try:
            blocks.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
        except RuntimeError as failure:  # torch's OutOfMemoryError, or HAMi-core's refusal
            error = f"{type(failure).__name__}: {str(failure)[:200]}"
            break
    result["allocated_gib"] = len(blocks)
    result["allocation_error"] = error
    del blocks
    torch.cuda.empty_cache()


def matmul(seconds: float, result: dict[str, Any]) -> None:
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        count += 10
    elapsed = time.perf_counter() - start
    result["matmul_tflops"] = round(count * 2 * SIZE**3 / elapsed / 1e12, 1)


def hold(gib: int, prefix: str, seconds: float) -> None:
    blocks = [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(gib)]
    Path(prefix + ".ready").write_text(str(os.getpid()))
    deadline = time.monotonic() + seconds
    while not Path(prefix + ".go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    del blocks


def main() -> None:
    result: dict[str, Any] = {"pid": os.getpid(), "visible": torch.cuda.device_count()}
    try:
        result["name"] = torch.cuda.get_device_name(0)
        free, total = torch.cuda.mem_get_info()
        result["mem_get_info_gib"] = [round(free / GIB, 2), round(total / GIB, 2)]
        result["driver_libraries"] = driver_libraries()
        if os.environ.get("GPU_CHECK_ALLOCATE") == "1":
            allocate_until_failure(result)
        if seconds := float(os.environ.get("GPU_CHECK_MATMUL_SECONDS", "0")):
            matmul(seconds, result)
        if gib := int(os.environ.get("GPU_CHECK_HOLD_GIB", "0")):
            hold(gib, os.environ["GPU_CHECK_HOLD"], float(os.environ.get("GPU_CHECK_HOLD_SECONDS", "60")))
    except Exception as failure:
        result["error"] = f"{type(failure).__name__}: {failure}"
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
