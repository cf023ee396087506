"""The kernel's boot ID: tells state written before a reboot from state of this boot.

MIG instances, MPS daemons and the CDI directory (a tmpfs) are gone after a reboot, while files
under the state directory survive it; comparing boot IDs tells which records still describe
something real.
"""

from pathlib import Path

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id() -> str:
    return BOOT_ID_PATH.read_text().strip()
