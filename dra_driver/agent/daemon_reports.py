"""The claim engine's reports on the GPUs' MPS daemons, on their way to the node's pool.

The engine reports from its start on (recovery finds a daemon dead), before the pool that turns
the reports into device health exists; those wait here, with the time they were made, and go to
the pool once it follows. Later reports go straight through.
"""

import time
from collections.abc import Callable

# A GPU's daemon: answering, dead, or stopped with its last share (None), reported at a time.
DaemonReportAt = Callable[[str, bool | None, float], None]


class DaemonReports:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._waiting: list[tuple[str, bool | None, float]] = []
        self._to: DaemonReportAt | None = None

    def report(self, gpu_uuid: str, up: bool | None) -> None:
        if self._to is None:
            self._waiting.append((gpu_uuid, up, self._clock()))
        else:
            self._to(gpu_uuid, up, self._clock())

    def follow(self, to: DaemonReportAt) -> None:
        self._to = to
        for waiting in self._waiting:
            to(*waiting)
        self._waiting.clear()
