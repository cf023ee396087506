"""`--dry-run`: the ResourceSlice writes the agent would make, as YAML on stdout.

Each document names the verb and the slice and carries the full body for creates and updates,
so an operator can diff it against `kubectl get resourceslices -o yaml` before letting the
agent write.
"""

import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from dra_driver.publish.diff import Create, Delete, Update, Write


def write_document(write: Write) -> dict[str, Any]:
    match write:
        case Create(body=body):
            return {"verb": "create", "generateName": body["metadata"]["generateName"], "body": body}
        case Update(name=name, body=body):
            return {"verb": "update", "name": name, "body": body}
        case Delete(name=name, why=why):
            return {"verb": "delete", "name": name, "why": why}


def print_writes(writes: Sequence[Write], out: TextIO | None = None) -> None:
    """The header and its documents in one write: the agent's log lines (stderr, from other
    threads too) may share the file or terminal, and one landing between the two would make the
    YAML unreadable (it did once, in a clean-clone run of the contract tests)."""
    stream = out or sys.stdout
    documents = [write_document(write) for write in writes]
    text = yaml.safe_dump_all(documents, sort_keys=False) if documents else ""
    stream.write(f"# dry run: {len(writes)} ResourceSlice write(s) would be made\n{text}")
    stream.flush()
