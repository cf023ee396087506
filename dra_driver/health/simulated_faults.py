"""Injecting faults into a running agent's simulated GPUs: `dra-driver simulate-fault`.

The simulated backend lives inside the agent's process, so a fault is handed over through an
inbox directory under the agent's state directory: the command drops one small JSON file
(atomically), and the agent applies and removes it on its next health check. Files are the one
channel that works the same from a shell on the node, from a test, and from `kubectl exec`.

An agent on simulated GPUs opens the inbox by writing its GPU list there (`gpus.json`), so the
command refuses a GPU the node does not have, and a directory no such agent uses, at once
instead of queueing a fault nobody will ever apply.
"""

import json
import secrets
import time
from pathlib import Path
from typing import Literal

import msgspec
import structlog

from dra_driver.base.errors import OperatorFault
from dra_driver.base.typed_decode import typed
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.state import durable_files

log = structlog.get_logger("dra_driver.health")

INBOX = "simulated-faults"
GPUS_FILE = "gpus.json"
# What an agent leaves in its state directory whatever its hardware (node.PUBLISHER_LOCK,
# node.SIMULATED_HARDWARE_STATE, claims.records): how a state directory is told from another one.
AGENT_STATE_ENTRIES = ("publisher.lock", "claims", "simulated-hardware.json")
FaultKind = Literal["xid", "lost"]


class SimulatedFault(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # A GPU UUID, or its index on the node as a string.
    gpu: str
    kind: FaultKind
    xid: int = 0


class _GpusFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """gpus.json: the node's GPUs, index (as a string) to UUID."""

    gpus: dict[str, str]


class FaultError(OperatorFault, ValueError):
    """A fault that cannot be injected; the message names what is wrong."""


def inbox(state_dir: Path) -> Path:
    return state_dir / INBOX


def open_inbox(state_dir: Path, gpus_by_index: dict[str, str]) -> None:
    """Called by an agent on simulated GPUs: says which GPUs a fault may name."""
    directory = inbox(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"gpus": gpus_by_index}).encode()
    durable_files.atomic_write(directory / GPUS_FILE, body, durable=False, mode=0o644)


def inbox_gpus(state_dir: Path) -> dict[str, str]:
    """The GPUs (index -> UUID) of the agent on simulated GPUs that uses `state_dir`. Raises
    FaultError saying why faults cannot be handed to an agent there."""
    try:
        gpus = typed(json.loads((inbox(state_dir) / GPUS_FILE).read_text()), _GpusFile).gpus
    except FileNotFoundError:
        if any((state_dir / entry).exists() for entry in AGENT_STATE_ENTRIES):
            raise FaultError(
                f"--state-dir {state_dir}: the agent there does not run simulated GPUs "
                "(faults can only be injected into an agent started with --hardware simulated:...)"
            ) from None
        raise FaultError(
            f"--state-dir {state_dir}: not an agent's state directory (none of {INBOX}/{GPUS_FILE}, "
            f"{', '.join(AGENT_STATE_ENTRIES)}); give the agent's --state-dir, "
            "by default <plugins-dir>/<driver-name>"
        ) from None
    except (OSError, ValueError) as error:
        raise FaultError(f"--state-dir {state_dir}: unreadable {INBOX}/{GPUS_FILE}: {error}") from error
    return gpus


def submit_fault(state_dir: Path, fault: SimulatedFault) -> Path:
    """Raises FaultError for a fault that cannot be handed over (bad XID, no such GPU, no agent
    on simulated GPUs using the directory); OSError when the inbox cannot be written."""
    _check_xid(fault, "--xid")
    _gpu_uuid(inbox_gpus(state_dir), fault.gpu, "--gpu ")
    directory = inbox(state_dir)
    path = directory / f"{time.time_ns()}-{secrets.token_hex(4)}.json"
    body = {"gpu": fault.gpu, "kind": fault.kind, "xid": fault.xid}
    durable_files.atomic_write(path, json.dumps(body).encode(), durable=False, mode=0o600)
    return path


def _check_xid(fault: SimulatedFault, field: str) -> None:
    if fault.kind == "xid" and not 0 < fault.xid < 1000:
        raise FaultError(f"{field}: {fault.xid} is not an XID (1 to 999)")


def _gpu_uuid(backend_gpus: dict[str, str], wanted: str, flag: str = "") -> str:
    if wanted in backend_gpus.values():
        return wanted
    if wanted in backend_gpus:
        return backend_gpus[wanted]
    raise FaultError(
        f"{flag}no GPU {wanted!r} on this node; GPUs: "
        f"{', '.join(f'{i} ({u})' for i, u in backend_gpus.items())}"
    )


def apply_pending_faults(state_dir: Path, backend: SimulatedBackend, gpus_by_index: dict[str, str]) -> int:
    """Applies every fault in the inbox (oldest first) and removes it; a malformed one is
    logged and removed too, so one bad file never blocks the others. Returns how many applied."""
    directory = inbox(state_dir)
    if not directory.is_dir():
        return 0
    applied = 0
    for path in sorted(directory.glob("*.json")):
        if path.name == GPUS_FILE:
            continue
        try:
            fault = typed(json.loads(path.read_text()), SimulatedFault)
            _check_xid(fault, "xid")
            gpu = _gpu_uuid(gpus_by_index, fault.gpu)
            if fault.kind == "lost":
                backend.lose_gpu(gpu)
            else:
                backend.raise_xid(gpu, fault.xid)
            applied += 1
            log.info("simulated fault injected", gpu=gpu, kind=fault.kind, xid=fault.xid)
        except (OSError, ValueError, HardwareError) as error:
            log.error("simulated fault refused", file=str(path), reason=str(error))
        path.unlink(missing_ok=True)
    return applied
