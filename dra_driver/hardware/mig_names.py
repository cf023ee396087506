"""MIG profile names as the NVIDIA tooling prints them ("1g.10gb", "1g.10gb+me").

NVML does not return a profile name, only numbers; users, mig-parted configs and other drivers
all speak in these names, so they are computed exactly as go-nvlib does: from the fraction of
the GPU's memory the profile gets, in eighths, times the GPU's memory in whole GiB.
"""

import math

GIB = 2**30

# NVML_GPU_INSTANCE_PROFILE_* enums whose names carry a suffix (nvml.h).
_SUFFIX_OF_ENUM = {
    0x7: "+me",  # 1_SLICE_REV1
    0x8: "+me",  # 2_SLICE_REV1
    0xA: "+gfx",  # 1_SLICE_GFX
    0xB: "+gfx",  # 2_SLICE_GFX
    0xC: "+gfx",  # 4_SLICE_GFX
    0x11: "+gfx",  # 3_SLICE_GFX
    0xD: "-me",  # 1_SLICE_NO_ME
    0xE: "-me",  # 2_SLICE_NO_ME
    0xF: "+me.all",  # 1_SLICE_ALL_ME
    0x10: "+me.all",  # 2_SLICE_ALL_ME
}


def mig_memory_gb(profile_memory_bytes: int, gpu_memory_bytes: int) -> int:
    """The "<GB>gb" number: rounded half away from zero (Python's round() would round half to even
    and misname e.g. B200 1g.23gb)."""
    eighths = math.ceil(8 * profile_memory_bytes / gpu_memory_bytes)
    return math.floor(eighths / 8 * math.ceil(gpu_memory_bytes / GIB) + 0.5)


def mig_profile_name(
    nvml_enum: int, compute_slices: int, profile_memory_bytes: int, gpu_memory_bytes: int
) -> str:
    gigabytes = mig_memory_gb(profile_memory_bytes, gpu_memory_bytes)
    return f"{compute_slices}g.{gigabytes}gb{_SUFFIX_OF_ENUM.get(nvml_enum, '')}"
