"""structlog setup: JSON lines in clusters (for log pipelines), readable lines on a terminal."""

import logging
import sys
from typing import TextIO

import structlog

from dra_driver.settings import LogFormat


def configure_logging(log_format: LogFormat, verbosity: int, stream: TextIO = sys.stderr) -> None:
    level = logging.DEBUG if verbosity > 0 else logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if log_format == "json":
        processors.append(structlog.processors.dict_tracebacks)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
