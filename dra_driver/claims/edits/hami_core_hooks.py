"""Whether a file is a HAMi-core `libvgpu.so` that can enforce vGPU limits at all (pure).

HAMi-core enforces by interposition: it is preloaded into every process of a claim and its own
`cu*` functions are found before the driver's. That only works for functions the library
exports. Built in CMake's Release mode it compiles with `-fvisibility=hidden` and exports none of
them: it loads, logs that it is initialising, and limits nothing (on an H200 a workload took
16 GiB under an 8Gi share). The agent reads the library's dynamic symbols once, at start, and
refuses such a build as invalid configuration rather than hand out shares it cannot hold.
"""

from dra_driver.hardware.elf_symbols import ElfError, exported_symbols

# One hook per limit the driver promises, so a build that lacks any of them breaks one promise:
# - cuMemAlloc_v2: every driver-API allocation goes through it; the memory limit
#   (CUDA_DEVICE_MEMORY_LIMIT_<i>) is refused here.
# - cuMemGetInfo_v2: what a program is told the GPU has; without it frameworks (PyTorch's
#   caching allocator, TensorFlow's memory growth) size themselves to the whole GPU.
# - cuLaunchKernel: where the SM share (CUDA_DEVICE_SM_LIMIT_<i>) throttles kernel launches.
REQUIRED_HOOKS = ("cuMemAlloc_v2", "cuMemGetInfo_v2", "cuLaunchKernel")

HIDDEN_BUILD_ADVICE = (
    "HAMi-core was built with hidden symbols (CMake Release); "
    "build it with CMAKE_BUILD_TYPE=Debug (see docs/install.md)"
)


def hami_core_library_problem(image: bytes) -> str | None:
    """What makes the file unable to enforce limits, as words that follow its path; None: it
    exports every required hook."""
    try:
        exported = exported_symbols(image, among=REQUIRED_HOOKS)
    except ElfError as error:
        return str(error)
    missing = [hook for hook in REQUIRED_HOOKS if hook not in exported]
    if len(missing) == len(REQUIRED_HOOKS):
        return f"exports none of {', '.join(missing)}: {HIDDEN_BUILD_ADVICE}"
    if missing:
        return f"does not export {', '.join(missing)}, which HAMi-core needs to enforce vGPU limits"
    return None
