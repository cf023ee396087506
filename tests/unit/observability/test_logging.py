"""configure_logging's output: JSON lines that stay whole, whatever writes them, and carry the
fields of the log context they were written in."""

import asyncio
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from dra_driver.observability.logs import LogContext, configure_logging


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "agent.log"
    with path.open("w") as stream:
        configure_logging("json", 0, stream)
        yield path
    structlog.reset_defaults()


def logged(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lines_from_many_threads_stay_whole(log_file: Path) -> None:
    log = structlog.get_logger("test")

    def write_lines(thread: int) -> None:
        for n in range(200):
            log.info("claim prepared", thread=thread, n=n, padding="x" * 300)

    threads = [threading.Thread(target=write_lines, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = logged(log_file)
    assert len(lines) == 800
    written = sorted((line["thread"], line["n"]) for line in lines)
    assert written == [(thread, n) for thread in range(4) for n in range(200)]
    assert {line["level"] for line in lines} == {"info"}


def test_a_partly_taken_line_is_finished(log_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def write_at_most_seven_bytes(fd: int, data: bytes) -> int:
        return real_write(fd, data[:7])

    monkeypatch.setattr(os, "write", write_at_most_seven_bytes)
    structlog.get_logger("test").warning("device unhealthy", device="gpu-3")
    monkeypatch.undo()
    (line,) = logged(log_file)
    assert (line["event"], line["device"], line["level"]) == ("device unhealthy", "gpu-3", "warning")


def test_a_line_renders_what_structlogs_own_json_renderer_renders(log_file: Path) -> None:
    """The encoder built once writes each line as structlog's renderer would: values JSON has no
    form for by their __structlog__() or else their repr."""

    class Described:
        def __structlog__(self) -> str:
            return "described"

    class Plain:
        def __repr__(self) -> str:
            return "<plain>"

    fields: dict[str, object] = {"described": Described(), "plain": Plain(), "text": "ü", "n": [1, 2.5]}
    structlog.get_logger("t").info("values", **fields)
    (line,) = logged(log_file)
    stock = json.loads(structlog.processors.JSONRenderer()(None, "info", {"event": "values", **fields}))
    assert {key: line[key] for key in stock} == stock
    assert line["described"] == "described" and line["plain"] == "<plain>"


def test_lines_carry_the_fields_of_their_log_context_and_only_while_it_lasts(log_file: Path) -> None:
    log = structlog.get_logger("t")
    with LogContext(claim_uid="u1", claim_name="a"):
        log.info("outer")
        with LogContext(claim_name="b", pool="p"):
            log.info("inner")
            log.info("own field wins", pool="mine")
        log.info("outer again")
    log.info("outside")
    lines = {line["event"]: line for line in logged(log_file)}
    context_keys = ("claim_uid", "claim_name", "pool")

    def fields(event: str) -> dict[str, object]:
        return {key: lines[event][key] for key in context_keys if key in lines[event]}

    assert fields("outer") == fields("outer again") == {"claim_uid": "u1", "claim_name": "a"}
    assert fields("inner") == {"claim_uid": "u1", "claim_name": "b", "pool": "p"}
    assert fields("own field wins") == {"claim_uid": "u1", "claim_name": "b", "pool": "mine"}
    assert fields("outside") == {}


async def test_concurrent_tasks_keep_their_own_log_context(log_file: Path) -> None:
    """Each task's lines name its own claim, though the tasks interleave on one event loop."""
    log = structlog.get_logger("t")

    async def handle(uid: str) -> None:
        with LogContext(claim_uid=uid):
            for step in range(3):
                log.info("step", step=step)
                await asyncio.sleep(0)

    await asyncio.gather(handle("first"), handle("second"))
    log.info("after")
    lines = logged(log_file)
    steps = [(line["claim_uid"], line["step"]) for line in lines if line["event"] == "step"]
    assert sorted(steps) == [(uid, step) for uid in ("first", "second") for step in range(3)]
    assert steps[:2] == [("first", 0), ("second", 0)]  # interleaved, not one after the other
    assert "claim_uid" not in lines[-1]


def test_library_lines_through_the_standard_logging_module_carry_the_context(log_file: Path) -> None:
    with LogContext(claim_uid="u9"):
        logging.getLogger("some.library").warning("retrying")
    (line,) = logged(log_file)
    assert (line["event"], line["claim_uid"], line["level"]) == ("retrying", "u9", "warning")
