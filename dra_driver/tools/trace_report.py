"""`dra-driver plan --trace`'s answer: per mode, the static and the live order side by side, as
a table for people and as JSON for scripts (the same numbers in both)."""

import json
from collections.abc import Sequence
from typing import Any

from dra_driver.packing.trace_plan import OrderReplay

# (static, live) per mode.
Replays = Sequence[tuple[OrderReplay, OrderReplay]]


def _first(replay: OrderReplay) -> str:
    seconds = replay.first_refusal_seconds
    return "none" if seconds is None else f"{seconds:g} s"


def _writes(replay: OrderReplay) -> str:
    if replay.plan.order == "static":
        return "0 (the order never changes)"
    per_change = replay.slice_writes / replay.changes if replay.changes else 0.0
    return f"{replay.slice_writes} ({per_change:.2f} per allocation change)"


def _refused_kinds(replay: OrderReplay) -> str:
    return ", ".join(f"{o.refused}x{o.group.shape.text}" for o in replay.plan.groups if o.refused) or "-"


def trace_table(node: str, trace_line: str, replays: Replays) -> str:
    lines = [f"node: {node}", f"trace: {trace_line}", ""]
    for static, live in replays:
        rows = [
            ("", "static order", "live order"),
            ("admitted", str(static.plan.placed), str(live.plan.placed)),
            ("refused", str(static.refused), str(live.refused)),
            ("refused by kind", _refused_kinds(static), _refused_kinds(live)),
            ("first refusal at", _first(static), _first(live)),
            ("slice writes", _writes(static), _writes(live)),
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(3)]
        lines.append(f"mode {static.plan.mode}: {static.plan.asked} pods arrive")
        lines += [f"  note: {note}" for note in static.plan.notes]
        lines += [
            "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.append("")
    return "\n".join(lines)


def _order(replay: OrderReplay) -> dict[str, Any]:
    return {
        "admitted": replay.plan.placed,
        "refused": replay.refused,
        "refused_by_kind": {o.group.shape.text: o.refused for o in replay.plan.groups},
        "first_refusal_seconds": replay.first_refusal_seconds,
        "slice_writes": replay.slice_writes,
        "allocation_changes": replay.changes,
    }


def trace_json(node: str, trace_line: str, replays: Replays) -> str:
    document = {
        "node": node,
        "trace": trace_line,
        "modes": [
            {
                "mode": static.plan.mode,
                "arrivals": static.plan.asked,
                "notes": list(static.plan.notes),
                "static": _order(static),
                "live": _order(live),
            }
            for static, live in replays
        ],
    }
    return json.dumps(document, indent=2) + "\n"
