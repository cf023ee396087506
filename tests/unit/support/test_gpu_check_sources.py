"""The GPU check only reads the GPU: no NVML setter and no nvidia-smi command that changes a
setting appears in its sources (the first real-GPU machine was shared; a check that changed its
compute mode, MIG mode, clocks or persistence would have changed it for everyone)."""

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
SOURCES = [
    *sorted((REPOSITORY / "tests" / "support" / "gpu_check").glob("*.py")),
    *sorted((REPOSITORY / "hack" / "gpu-check").glob("*")),
]
# NVML's setters, and those nvidia-smi options that change state rather than report it.
SETTERS = re.compile(
    r"nvmlDevice(Set|Reset|Clear)\w*|nvmlGpuInstance(Create|Destroy)|nvmlComputeInstance(Create|Destroy)"
    r"|nvidia-smi[^\n]*?[\s\x22\x27](-c|--compute-mode|-mig|--multi-instance-gpu|-pm|--persistence-mode|-ac"
    r"|--applications-clocks|-rac|-lgc|--lock-gpu-clocks|-rgc|-lmc|-pl|--power-limit|-r|--gpu-reset"
    r"|-e|--ecc-config|mig\s+-[cd][gc]i)\b"
)


def setter_uses(text: str) -> list[str]:
    return [match.group(0) for match in SETTERS.finditer(text)]


def test_the_check_has_sources_to_read() -> None:
    names = {path.name for path in SOURCES}
    assert {"steps.py", "workload.py", "run.sh", "wheelhouse.sh"} <= names


def test_no_source_of_the_check_changes_a_gpu_setting() -> None:
    found = {str(path.relative_to(REPOSITORY)): setter_uses(path.read_text()) for path in SOURCES}

    assert {path: uses for path, uses in found.items() if uses} == {}


def test_the_search_finds_setters() -> None:
    """Guards the test above: each way of changing a setting is found."""
    for text in (
        "pynvml.nvmlDeviceSetComputeMode(handle, 3)",
        "nvmlDeviceSetMigMode(h, 1)",
        "nvmlDeviceResetGpuLockedClocks(h)",
        'subprocess.run(["nvidia-smi", "-c", "EXCLUSIVE_PROCESS"])',
        "nvidia-smi -i 0 -mig 1",
        "nvidia-smi -pm 1",
        "nvidia-smi --lock-gpu-clocks=1980",
        "nvidia-smi mig -cgi 19 -C",
    ):
        assert setter_uses(text), text
    assert setter_uses("nvidia-smi --query-gpu=name,compute_mode --format=csv") == []
    assert setter_uses("pynvml.nvmlDeviceGetComputeMode(handle)") == []
