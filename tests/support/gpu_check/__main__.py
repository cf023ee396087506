"""`python -m tests.support.gpu_check --out DIR`: the GPU check (hack/gpu-check/run.sh runs it;
docs/gpu-check.md). Exit 0 when every check passed or was skipped for a stated reason and at
least one passed, 1 when one failed, 2 on bad arguments."""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.gpu_check.report import StepRecord, to_json, to_text, verdict
from tests.support.gpu_check.runner import run_steps
from tests.support.gpu_check.steps import Context, Options, gpu_steps

TOTAL_S = 280.0


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="directory for the report and logs")
    parser.add_argument("--hami-core-source", type=Path, help="HAMi-core's source; without it no vGPU limits")
    parser.add_argument("--skip", action="append", default=[], metavar="STEP", help="leave a step out")
    parser.add_argument("--agent-arg", action="append", default=[], help="one more argument for the agent")
    parser.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--workload", help="the workload command (default: workload.py under this Python)")
    parser.add_argument("--hold-gib", type=int, default=4)
    parser.add_argument("--total-seconds", type=float, default=TOTAL_S)
    args = parser.parse_args(argv)
    names = {step.name for step in gpu_steps()}
    if unknown := sorted(set(args.skip) - names):
        parser.error(f"--skip: no step {', '.join(unknown)}; steps: {', '.join(sorted(names))}")
    if bad := [entry for entry in args.agent_env if "=" not in entry]:
        parser.error(f"--agent-env {bad[0]!r}: expected NAME=VALUE")
    if args.hami_core_source and not (args.hami_core_source / "CMakeLists.txt").is_file():
        parser.error(f"--hami-core-source {args.hami_core_source}: no CMakeLists.txt there")
    if not 0 < args.hold_gib <= 64:
        parser.error("--hold-gib: expected 1..64")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # The agents' state and specs and the hold files of the run: what is worth keeping (logs,
    # reports) is copied to --out, and the rest would pile up in /tmp with every run.
    scratch = Path(tempfile.mkdtemp(prefix="gc-", dir="/tmp"))
    try:
        return run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args: argparse.Namespace, scratch: Path) -> int:
    options = Options(
        out=args.out.resolve(),
        scratch=scratch,
        hami_source=args.hami_core_source.resolve() if args.hami_core_source else None,
        agent_args=tuple(args.agent_arg),
        agent_env=dict(entry.split("=", 1) for entry in args.agent_env),
        hold_gib=args.hold_gib,
    )
    if args.workload:
        options = dataclasses.replace(options, workload=tuple(shlex.split(args.workload)))
    steps = [step for step in gpu_steps() if step.name not in args.skip]
    started = time.monotonic()

    def progress(record: StepRecord) -> None:
        statuses = ", ".join(f"{c.status} {c.name}" for c in record.checks)
        print(f"[{time.monotonic() - started:6.1f} s] {record.step}: {statuses}", file=sys.stderr, flush=True)

    records = run_steps(steps, Context(options), args.total_seconds, progress=progress)
    facts = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "hami_core_source": str(options.hami_source) if options.hami_source else "none",
        "workload": shlex.join(options.workload),
        "skipped_steps": list(args.skip),
        "total_s": round(time.monotonic() - started, 1),
        "uid": os.getuid(),
    }
    text = to_text(records, facts)
    (args.out / "report.txt").write_text(text)
    (args.out / "report.json").write_text(json.dumps(to_json(records, facts), indent=1, default=str) + "\n")
    print(text, end="")
    return 0 if verdict(records) == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
