"""The check's one report: every step's checks with their numbers, a verdict per check and one
for the run, as text for a person and as JSON for a machine. Pure."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# `known`: a limitation the docs document, measured as documented. It fails nothing; should the
# limitation go away, the judge makes it a failure, so the docs are corrected.
Status = Literal["pass", "fail", "skip", "known"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "known", "skip")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str = ""
    numbers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: str
    seconds: float
    checks: tuple[Check, ...]


def verdict(records: Sequence[StepRecord]) -> Status:
    """Fail when any check failed; pass when none did and at least one passed (a run that
    checked nothing proves nothing, so it is a skip, and the exit code treats it as a failure).
    A documented limitation (`known`) neither fails nor passes a run."""
    statuses = {check.status for record in records for check in record.checks}
    if "fail" in statuses:
        return "fail"
    return "pass" if "pass" in statuses else "skip"


def to_json(records: Sequence[StepRecord], facts: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "verdict": verdict(records),
        "facts": dict(facts),
        "steps": [
            {
                "step": record.step,
                "seconds": round(record.seconds, 2),
                "checks": [
                    {"name": c.name, "status": c.status, "detail": c.detail, "numbers": dict(c.numbers)}
                    for c in record.checks
                ],
            }
            for record in records
        ],
    }


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str | int | bool) or value is None:
        return str(value)
    return json.dumps(value, default=str)


def to_text(records: Sequence[StepRecord], facts: Mapping[str, Any]) -> str:
    lines = ["dra-driver GPU check", *(f"  {key}: {_number(value)}" for key, value in facts.items()), ""]
    for record in records:
        lines.append(f"{record.step} ({record.seconds:.1f} s)")
        for check in record.checks:
            lines.append(
                f"  [{check.status.upper():4}] {check.name}{': ' + check.detail if check.detail else ''}"
            )
            lines += [f"           {key} = {_number(value)}" for key, value in check.numbers.items()]
    counts = {s: sum(c.status == s for r in records for c in r.checks) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    lines += ["", f"verdict: {verdict(records).upper()} ({summary})"]
    return "\n".join(lines) + "\n"
