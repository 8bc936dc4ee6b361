"""Structured logging: structlog, JSON lines, request/session ids bound through contextvars.

Log events are snake_case facts with key-value data. `configure()` is called once by the entry point; the
middleware binds `request_id` (and handlers bind `session_id`, `turn_id`) for the duration of a request.
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure"]


def configure(*, level: str = "info", json: bool = True) -> None:
    """Route structlog (and the stdlib loggers uvicorn uses) to stderr at `level`."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s", force=True)
