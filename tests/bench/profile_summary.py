"""Summarises py-spy's raw (collapsed-stack) profiles of the agent as text: where its time goes.

`python -m tests.bench.prepare_latency --profile DIR` writes one file per figure and run, sampled
with `py-spy record --threads --format raw` (and its `--profile-mode`): one line per distinct
stack, `thread (tid): name;outermost frame;...;innermost frame COUNT`, each frame
`function (file:line)`. Only busy threads are sampled (by default only the one holding the GIL),
so the shares below are of the CPU time the agent used, not of wall time: waiting for the disk or
the API server costs nothing here (the latency figures show it).

Printed per input (several files are added together): samples by thread; by component (what the
sample was doing for the agent: the claim GET, the records, the CDI spec, locks, logging...; see
COMPONENTS); self time (the innermost Python frame, which includes the C code it called: grpc's
Cython core, epoll, json, syscalls); the same by package or module of that frame; and inclusive
time (every function on the stack, each counted once per sample), which shows the call paths.
Frames are taken without their line number unless `--lines`.

Python frames that grpc's Cython server resumes have no frames above them (py-spy cannot walk
through Cython), so the servicer's stacks start at the servicer or the engine, not at the event
loop, and time in grpc's Cython code itself shows as self time of `Handle._run`.

Run: `python -m tests.bench.profile_summary /tmp/dra-profile/single-run1.txt --top 15`.
"""

import argparse
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \(\d+\): ?(?P<name>.*)$")
# asyncio's default executor names its threads asyncio_0, asyncio_1, ...: one group.
_NUMBERED_THREAD = re.compile(r"^(?P<stem>.*?)_?\d+$")

# What a sample was for: the first of these with a frame on the sample's stack, in this order
# (most specific first: a log line written from the engine is logging; the engine is on the
# stack of almost everything, and the gRPC servicer of everything the engine does).
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging (structlog)", ("structlog/", "logging/", "dra_driver/observability/server.py")),
    (
        "metrics",
        (
            "prometheus_client/",
            "dra_driver/observability/metrics.py",
            "dra_driver/observability/usage_metrics.py",
        ),
    ),
    (
        "claim GET (kube_http, its asyncio streams, JSON)",
        (
            "asyncio/streams.py",
            "dra_driver/kube/calls.py",
            "dra_driver/kube/kube_api.py",
            "dra_driver/kube/kube_http.py",
            "dra_driver/kube/http_wire.py",
            "dra_driver/claims/source.py",
        ),
    ),
    ("CDI spec write/remove", ("dra_driver/claims/edits/cdi_files.py", "dra_driver/claims/edits/cdi.py")),
    (
        "claim records (durable writes, files)",
        (
            "dra_driver/state/durable_writes.py",
            "dra_driver/state/durable_files.py",
            "dra_driver/claims/record_store.py",
            "dra_driver/claims/records.py",
        ),
    ),
    ("claim and state locks", ("dra_driver/state/shared_locks.py", "dra_driver/state/keyed_locks.py")),
    ("thread hand-off (to_thread, executor)", ("asyncio/threads.py", "concurrent/futures/")),
    ("claim checks, planning, engine", ("dra_driver/claims/",)),
    ("gRPC servicer (answer building)", ("dra_driver/plugin/",)),
    ("other agent code", ("dra_driver/",)),
    # Last: grpc's Cython frames (seen with --native) sit above every servicer stack.
    ("gRPC library (grpc/, cygrpc)", ("grpc/",)),
)
OUTSIDE_COMPONENTS = "event loop, gRPC core, other C (no frame above)"
# Frames of the agent below the event loop, on every stack of the main thread: not a component.
_OUTER_FILES = ("dra_driver/__main__.py", "dra_driver/cli.py")


@dataclass
class Profile:
    """Sample counts by thread, by innermost frame and by every frame on the stack."""

    samples: int = 0
    threads: Counter[str] = field(default_factory=Counter)
    self_time: Counter[str] = field(default_factory=Counter)
    self_by_module: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    components: Counter[str] = field(default_factory=Counter)


def _frame_file(frame: str) -> str:
    match = _FRAME.match(frame)
    return "" if match is None else match["file"]


def _frame_name(frame: str, with_line: bool) -> tuple[str, str]:
    """('function (file[:line])', module) of a py-spy frame."""
    match = _FRAME.match(frame)
    if match is None:
        return frame, frame
    file = match["file"]
    location = f"{file}:{match['line']}" if with_line and match["line"] else file
    module = file.removesuffix(".py")
    # Our own code module by module; a library or the standard library by package.
    module = module.replace("/", ".") if module.startswith("dra_driver/") else module.split("/")[0]
    return f"{match['function']} ({location})", module


def component(files: Sequence[str]) -> str:
    """The first of COMPONENTS with a frame among `files` (the stack's source files)."""
    inner = [file for file in files if not file.startswith(_OUTER_FILES)]
    for name, prefixes in COMPONENTS:
        if any(file.startswith(prefixes) for file in inner):
            return name
    return OUTSIDE_COMPONENTS


def _thread_group(name: str) -> str:
    numbered = _NUMBERED_THREAD.match(name)
    return f"{numbered['stem']}_*" if numbered and numbered["stem"] == "asyncio" else name


def read_profile(lines: Iterable[str], thread_filter: str | None, with_line: bool) -> Profile:
    profile = Profile()
    for raw in lines:
        stack, _, count_text = raw.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "?"
        if (thread_match := _THREAD.match(frames[0])) is not None:
            thread = _thread_group(thread_match["name"])
            frames = frames[1:]
        if thread_filter is not None and thread_filter not in thread:
            continue
        profile.samples += count
        profile.threads[thread] += count
        if not frames:
            continue
        profile.components[component([_frame_file(frame) for frame in frames])] += count
        names = [_frame_name(frame, with_line) for frame in frames]
        innermost, module = names[-1]
        profile.self_time[innermost] += count
        profile.self_by_module[module] += count
        for name in {name for name, _ in names}:
            profile.inclusive[name] += count
    return profile


def _table(title: str, counts: Counter[str], total: int, top: int) -> list[str]:
    lines = [title]
    for name, count in counts.most_common(top):
        lines.append(f"  {100 * count / total:5.1f}%  {name}")
    return lines


def summarise(profile: Profile, top: int) -> str:
    if profile.samples == 0:
        return "no samples"
    total = profile.samples
    lines = [f"{total} samples (on-CPU)"]
    lines += _table("by thread:", profile.threads, total, top)
    lines += _table("by component (see COMPONENTS):", profile.components, total, len(COMPONENTS) + 1)
    lines += _table("self (innermost Python frame, with the C it calls):", profile.self_time, total, top)
    lines += _table("self, by module (ours) or package:", profile.self_by_module, total, top)
    lines += _table("inclusive (on the stack):", profile.inclusive, total, top * 2)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profiles", nargs="+", type=Path, help="py-spy raw files, added together")
    parser.add_argument("--top", type=int, default=15, help="entries per table (inclusive: twice)")
    parser.add_argument("--thread", help="only threads whose name contains this, e.g. MainThread")
    parser.add_argument("--lines", action="store_true", help="keep line numbers in frame names")
    args = parser.parse_args()
    lines = (line for path in args.profiles for line in path.read_text().splitlines())
    print(summarise(read_profile(lines, args.thread, args.lines), args.top))


if __name__ == "__main__":
    main()
