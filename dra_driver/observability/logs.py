"""structlog setup: JSON lines in clusters (for log pipelines), readable lines on a terminal.

Libraries that log through the standard `logging` module (the Kubernetes client, aiohttp) are
routed through the same renderer, so a JSON log stays valid JSON line by line.
"""

import json
import logging
import os
import sys
from collections.abc import Mapping
from contextvars import ContextVar, Token
from types import MappingProxyType, TracebackType
from typing import Literal, TextIO

import structlog

# What `--log-format` chooses; defined here, where it is used, so the option layer above imports it.
LogFormat = Literal["json", "console"]


class _LineWriter:
    """structlog's output: each rendered line goes out in one write(2), one system call where
    `print` on an unbuffered stream (PYTHONUNBUFFERED) makes two, on the claim path's every log
    line. No lock: on a pipe (a container's output) one write of up to 4 KiB (PIPE_BUF) is never
    interleaved with another thread's, which covers our lines."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def msg(self, message: str) -> None:
        line = f"{message}\n".encode()
        while line:  # a pipe may take part of a long line (a signal, a full buffer): send the rest
            line = line[os.write(self._fd, line) :]

    debug = info = warning = error = critical = exception = msg


def _unencodable(value: object) -> object:
    """What structlog's JSON renderer makes of a value JSON has no form for: its __structlog__()
    where it has one, else its repr."""
    method = getattr(value, "__structlog__", None)
    return method() if callable(method) else repr(value)


# json.dumps given `default` builds a new encoder for every line; this one is built once.
_LINE_ENCODER = json.JSONEncoder(default=_unencodable)


def _json_line(event: object, **_: object) -> str:
    return _LINE_ENCODER.encode(event)


# The fields of the log context in force: one variable holding them all, so entering a context is
# one set and one reset, and a line merges them in one lookup. structlog's own context variables
# cost a scan of the whole `contextvars` context each time a claim's fields were bound and each
# time a line was written (the binding alone: 8 % of the engine's instructions per round).
_CONTEXT: ContextVar[Mapping[str, object]] = ContextVar(
    "dra_driver_log_context", default=MappingProxyType({})
)


class LogContext:
    """Fields every log line written inside it carries (a line's own fields win), nested
    contexts adding theirs. Each asyncio task runs in a copy of its creator's context, so fields
    bound in one task never show up in another's lines."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: object) -> None:
        self._fields = fields
        self._token: Token[Mapping[str, object]] | None = None

    def __enter__(self) -> None:
        outer = _CONTEXT.get()
        self._token = _CONTEXT.set({**outer, **self._fields} if outer else self._fields)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._token is not None
        _CONTEXT.reset(self._token)


def merge_log_context(
    logger: object, method_name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """The processor that puts the log context's fields into each line."""
    for key, value in _CONTEXT.get().items():
        event.setdefault(key, value)
    return event


def configure_logging(log_format: LogFormat, verbosity: int, stream: TextIO = sys.stderr) -> None:
    level = logging.DEBUG if verbosity > 0 else logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_json_line)
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        merge_log_context,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if log_format == "json":
        shared.append(structlog.processors.dict_tracebacks)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_: _LineWriter(stream.fileno()),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Library chatter only from -vv on; their warnings and errors always.
    root.setLevel(logging.DEBUG if verbosity > 1 else logging.WARNING)
