"""Named points where a test can have the agent killed (SIGKILL), to prove crash safety.

`DRA_DRIVER_FAILPOINTS=prepare.mig-created@2,unprepare.cdi-removed` kills the process the second
time it reaches `prepare.mig-created`, or the first time it reaches `unprepare.cdi-removed`. Unset
(as in every real deployment), `reached` is one dictionary lookup. SIGKILL rather than an
exception: nothing of the process runs after it, exactly as with the OOM killer or a node crash.
"""

import os
import signal

ENVIRONMENT_VARIABLE = "DRA_DRIVER_FAILPOINTS"

# Every point the engine passes, in the order a prepare and an unprepare pass them.
POINTS = (
    "prepare.preparing-recorded",
    "prepare.mig-created",
    "prepare.mps-started",
    "prepare.gpu-mps-started",
    "prepare.metadata-written",
    "prepare.cdi-written",
    "prepare.prepared-recorded",
    "unprepare.gpu-mps-stopped",
    "unprepare.mig-destroyed",
    "unprepare.record-deleted",
    "unprepare.cdi-removed",
    "unprepare.metadata-removed",
)


def _armed(text: str) -> dict[str, int]:
    armed = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("@")
        if name not in POINTS or (count and not count.isdigit()):
            raise ValueError(
                f"{ENVIRONMENT_VARIABLE}: {item!r} is not <point>[@<n>]; points: {', '.join(POINTS)}"
            )
        armed[name] = int(count or 1)
    return armed


_remaining = _armed(os.environ.get(ENVIRONMENT_VARIABLE, ""))


def reached(point: str) -> None:
    remaining = _remaining.get(point)
    if remaining is None:
        return
    if remaining > 1:
        _remaining[point] = remaining - 1
        return
    os.kill(os.getpid(), signal.SIGKILL)
