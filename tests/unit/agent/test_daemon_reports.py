"""The engine's MPS daemon reports reach the pool, also those made before the pool existed."""

from itertools import count

from dra_driver.agent.daemon_reports import DaemonReports


def test_reports_before_the_pool_follows_arrive_with_the_time_they_were_made() -> None:
    ticks = count(100)
    reports = DaemonReports(clock=lambda: float(next(ticks)))
    received: list[tuple[str, bool | None, float]] = []

    reports.report("GPU-a", False)  # start-up found the daemon dead
    reports.report("GPU-b", True)
    reports.follow(lambda gpu, up, at: received.append((gpu, up, at)))
    assert received == [("GPU-a", False, 100.0), ("GPU-b", True, 101.0)]

    reports.report("GPU-a", None)
    assert received[-1] == ("GPU-a", None, 102.0)
    assert len(received) == 3, "each report is handed on once"
