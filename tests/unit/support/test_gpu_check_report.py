"""The GPU check's verdicts: the rules that turn its numbers into pass or fail, and the report."""

import json

from dra_driver.hardware.usage import DeviceUsage, ProcessUsage
from tests.support.gpu_check import judge
from tests.support.gpu_check.report import Check, StepRecord, to_json, to_text, verdict

GIB = 2**30


def records(*statuses: str) -> list[StepRecord]:
    return [StepRecord(f"step{i}", 1.0, (Check(f"c{i}", s),)) for i, s in enumerate(statuses)]  # type: ignore[arg-type]


def test_one_failure_fails_the_run_and_a_run_that_checked_nothing_is_no_pass() -> None:
    assert verdict(records("pass", "skip")) == "pass"
    assert verdict(records("pass", "fail", "skip")) == "fail"
    assert verdict(records("skip", "skip")) == "skip"
    assert verdict([]) == "skip"
    assert verdict(records("pass", "known")) == "pass"  # a documented limitation fails nothing
    assert verdict(records("known")) == "skip"  # nor does it pass a run on its own


def test_the_report_carries_every_number_in_text_and_json() -> None:
    steps = [
        StepRecord("vgpu.limits", 0.01, (Check("vGPU memory limit (8 GiB)", "pass", numbers={"gib": 8}),)),
        StepRecord("whole.usage", 1.25, (Check("usage", "fail", "process 7 not seen", {"pid": [7]}),)),
    ]
    facts = {"python": "3.12.3"}

    text = to_text(steps, facts)
    data = to_json(steps, facts)

    assert "  [PASS] vGPU memory limit (8 GiB)\n           gib = 8\n" in text
    assert "  [FAIL] usage: process 7 not seen\n           pid = [7]\n" in text
    assert text.endswith("verdict: FAIL (1 pass, 1 fail, 0 known, 0 skip)\n")
    assert data["verdict"] == "fail"
    assert data["steps"][1] == {
        "step": "whole.usage",
        "seconds": 1.25,
        "checks": [
            {"name": "usage", "status": "fail", "detail": "process 7 not seen", "numbers": {"pid": [7]}}
        ],
    }
    assert json.loads(json.dumps(data)) == data


def test_contract_suite_counts_and_failures() -> None:
    passed = judge.contract_suite("....\n14 passed, 2 skipped in 38.2s\n", 0)
    failed = judge.contract_suite("F.\n1 failed, 13 passed in 40.0s\n", 1)
    nothing = judge.contract_suite("no tests ran in 0.1s\n", 5)

    assert (passed.status, dict(passed.numbers)) == ("pass", {"passed": 14, "skipped": 2})
    assert (failed.status, failed.detail) == ("fail", "pytest exited 1: 1 failed, 13 passed in 40.0s")
    assert nothing.status == "fail"


def test_host_paths() -> None:
    assert judge.host_paths([], 8, "whole").status == "pass"
    missing = judge.host_paths(["/dev/nvidia0"], 8, "whole")
    assert (missing.status, missing.detail, missing.numbers["missing"]) == (
        "fail",
        "1 of 8 missing",
        ["/dev/nvidia0"],
    )


def test_a_workload_fails_on_its_error_or_when_it_saw_no_gpu() -> None:
    assert judge.workload({"visible": 1, "allocated_gib": 3}, "whole").status == "pass"
    assert judge.workload({"visible": 0}, "whole").detail == "no GPU visible"
    assert judge.workload({"visible": 1, "error": "boom"}, "vgpu").status == "fail"


def device(*processes: ProcessUsage) -> DeviceUsage:
    return DeviceUsage("GPU-1", 30 * GIB, 141 * GIB, 12.0, processes)


def test_usage_needs_the_workload_process_with_the_memory_it_holds() -> None:
    held = judge.usage([device(ProcessUsage(42, 4 * GIB + 5))], pid=42, held_gib=4)
    short = judge.usage([device(ProcessUsage(42, 3 * GIB))], pid=42, held_gib=4)
    unaccounted = judge.usage([device(ProcessUsage(42, None))], pid=42, held_gib=4)
    absent = judge.usage([device(ProcessUsage(7, 9 * GIB))], pid=42, held_gib=4)

    assert held.status == "pass"
    assert held.numbers["process_memory_gib"] == [4.0]
    assert held.numbers["gpu_memory_used_gib"] == [30.0]
    assert [short.status, unaccounted.status, absent.status] == ["fail"] * 3
    assert absent.detail == "process 42 not among NVML's processes"


def test_the_memory_limit_holds_when_the_share_stops_at_its_size_and_the_gpu_does_not() -> None:
    assert judge.memory_limit(8, 139, 8).status == "pass"
    assert judge.memory_limit(7, 139, 8).status == "pass"
    assert judge.memory_limit(16, 139, 8).status == "fail"  # the limit did not hold
    assert judge.memory_limit(0, 139, 8).status == "fail"  # nothing allocated at all
    assert judge.memory_limit(8, 8, 8).status == "fail"  # no difference: proves nothing


def test_the_core_limit_holds_at_40_percent_of_the_unlimited_rate_or_less() -> None:
    limited = judge.core_limit(180.0, 720.0, 25)
    assert (limited.status, limited.numbers["ratio"]) == ("pass", 0.25)
    assert judge.core_limit(288.0, 720.0, 25).status == "pass"  # 40 %: the bar itself
    assert judge.core_limit(360.0, 720.0, 25).status == "fail"  # half is not enforcement
    assert judge.core_limit(656.0, 658.0, 25).status == "fail"  # HAMi-core on the H200
    assert judge.core_limit(0.0, 720.0, 25).status == "fail"
    assert judge.core_limit(100.0, 0.0, 25).status == "fail"


def test_a_documented_gap_is_known_while_it_lasts_and_a_failure_once_the_docs_are_wrong() -> None:
    documented = "HAMi-core does not hold compute"
    # The HAMi-core run on the H200, 2026-11-28: 657.7 of 658.5 TFLOP/s under a 25-core share.
    seen = judge.documented_gap(judge.core_limit(657.7, 658.5, 25), documented)
    assert (seen.status, seen.detail) == ("known", "not held, as documented: " + documented)
    assert seen.numbers["ratio"] == 0.999
    fixed = judge.documented_gap(judge.core_limit(180.0, 720.0, 25), documented)
    assert (fixed.status, fixed.detail) == ("fail", f"held, though documented as not held ({documented})")
    skipped = Check("vGPU core limit", "skip", "no library")
    assert judge.documented_gap(skipped, documented) is skipped


def test_the_container_loader_check_wants_every_driver_library_from_a_claim_mount() -> None:
    mounted = {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"}
    found = {"visible": 1, "driver_libraries": ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]}
    host = {"visible": 1, "driver_libraries": ["/usr/local/nvidia/lib64/libcuda.so.580.159.04"]}

    passed = judge.container_loader(found, mounted)
    assert (passed.status, passed.numbers["driver_libraries"]) == ("pass", found["driver_libraries"])
    outside = judge.container_loader(host, mounted)
    assert (outside.status, outside.detail) == (
        "fail",
        "loaded from outside the claim's mounts: /usr/local/nvidia/lib64/libcuda.so.580.159.04",
    )
    assert judge.container_loader({"visible": 1, "driver_libraries": []}, mounted).detail == (
        "no driver library loaded"
    )
    no_driver = {"visible": 0, "error": "RuntimeError: Found no NVIDIA driver on your system"}
    assert judge.container_loader(no_driver, mounted).detail == no_driver["error"]


def test_mps_limits_are_judged_by_the_same_bars_under_their_own_name() -> None:
    # The H200 run of the issue: 25 % threads gave 230.7 of 655 TFLOP/s (35 %); pinned 8G stopped at 7 GiB.
    core = judge.core_limit(230.7, 655.0, 25, "MPS")
    assert (core.name, core.status) == ("MPS core limit (25 %)", "pass")
    assert judge.memory_limit(7, 139, 8, "MPS").name == "MPS memory limit (8 GiB)"


def test_two_shares_at_once_each_get_40_to_60_percent_of_the_unshared_rate() -> None:
    both = judge.concurrent_shares([310.0, 330.0], 655.0, 50)
    assert (both.name, both.status, both.numbers["ratios"]) == (
        "2 MPS shares of 50 cores at once",
        "pass",
        [0.473, 0.504],
    )
    assert judge.concurrent_shares([262.0, 393.0], 655.0, 50).status == "pass"  # 40 % and 60 %: the bars
    assert judge.concurrent_shares([600.0, 55.0], 655.0, 50).status == "fail"  # one starved the other
    assert judge.concurrent_shares([650.0, 650.0], 655.0, 50).status == "fail"  # no limit (or not at once)
    assert judge.concurrent_shares([300.0, 300.0], 0.0, 50).status == "fail"
    assert judge.concurrent_shares([], 655.0, 50).status == "fail"


def test_settings_unchanged_names_what_changed() -> None:
    before = {"gpu0": {"compute_mode": 0, "mig_mode": 0}}
    assert judge.settings_unchanged(before, before).status == "pass"
    changed = judge.settings_unchanged(before, {"gpu0": {"compute_mode": 3, "mig_mode": 0}})
    assert (changed.status, changed.detail) == ("fail", "changed: gpu0")
