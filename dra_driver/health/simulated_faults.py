"""Injecting faults into a running agent's simulated GPUs: `dra-driver simulate-fault`.

The simulated backend lives inside the agent's process, so a fault is handed over through an
inbox directory under the agent's state directory: the command drops one small JSON file
(atomically), and the agent applies and removes it on its next health check. Files are the one
channel that works the same from a shell on the node, from a test, and from `kubectl exec`.
"""

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from dra_driver import durable_files
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.simulated import SimulatedBackend

log = structlog.get_logger("dra_driver.health")

INBOX = "simulated-faults"
FaultKind = Literal["xid", "lost"]


@dataclass(frozen=True, slots=True)
class SimulatedFault:
    # A GPU UUID, or its index on the node as a string.
    gpu: str
    kind: FaultKind
    xid: int = 0


class FaultError(ValueError):
    """A fault that cannot be injected; the message names what is wrong."""


def inbox(state_dir: Path) -> Path:
    return state_dir / INBOX


def submit_fault(state_dir: Path, fault: SimulatedFault) -> Path:
    if fault.kind == "xid" and not 0 < fault.xid < 1000:
        raise FaultError(f"--xid: {fault.xid} is not an XID (1 to 999)")
    directory = inbox(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{time.time_ns()}-{secrets.token_hex(4)}.json"
    body = {"gpu": fault.gpu, "kind": fault.kind, "xid": fault.xid}
    durable_files.atomic_write(path, json.dumps(body).encode(), durable=False, mode=0o600)
    return path


def _gpu_uuid(backend_gpus: dict[str, str], wanted: str) -> str:
    if wanted in backend_gpus.values():
        return wanted
    if wanted in backend_gpus:
        return backend_gpus[wanted]
    raise FaultError(
        f"no GPU {wanted!r} on this node; GPUs: {', '.join(f'{i} ({u})' for i, u in backend_gpus.items())}"
    )


def apply_pending_faults(state_dir: Path, backend: SimulatedBackend, gpus_by_index: dict[str, str]) -> int:
    """Applies every fault in the inbox (oldest first) and removes it; a malformed one is
    logged and removed too, so one bad file never blocks the others. Returns how many applied."""
    directory = inbox(state_dir)
    if not directory.is_dir():
        return 0
    applied = 0
    for path in sorted(directory.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            gpu = _gpu_uuid(gpus_by_index, str(raw["gpu"]))
            if raw["kind"] == "lost":
                backend.lose_gpu(gpu)
            elif raw["kind"] == "xid" and isinstance(raw["xid"], int):
                backend.raise_xid(gpu, raw["xid"])
            else:
                raise FaultError(f"kind {raw['kind']!r}: expected xid (with an integer xid) or lost")
            applied += 1
            log.info("simulated fault injected", gpu=gpu, kind=raw["kind"], xid=raw.get("xid"))
        except (ValueError, KeyError, TypeError, HardwareError) as error:
            log.error("simulated fault refused", file=str(path), reason=str(error))
        path.unlink(missing_ok=True)
    return applied
