"""configure_logging's output: JSON lines that stay whole, whatever writes them."""

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from dra_driver.observability.logs import configure_logging


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
