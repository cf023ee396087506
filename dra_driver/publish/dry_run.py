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
    stream = out or sys.stdout
    stream.write(f"# dry run: {len(writes)} ResourceSlice write(s) would be made\n")
    if writes:
        stream.write(yaml.safe_dump_all([write_document(write) for write in writes], sort_keys=False))
    stream.flush()
