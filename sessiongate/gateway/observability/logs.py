"""Structured logging: structlog, JSON lines, request/session ids bound through contextvars.

Log events are snake_case facts with key-value data, with secrets and user content redacted (`redaction`).
`configure()` is called once by the entry point; the
middleware binds `request_id` (and handlers bind `session_id`, `turn_id`) for the duration of a request.
"""

from __future__ import annotations

import logging
import sys

import structlog

from .redaction import Redactor

__all__ = ["configure"]


def configure(
    *, level: str = "info", json: bool = True, log_content: bool = False, secrets: tuple[str, ...] = ()
) -> None:
    """Route structlog (and the stdlib loggers uvicorn uses) to stderr at `level`.

    `log_content` lets message contents through (debugging only); `secrets` are values masked wherever seen."""
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
            Redactor(log_content=log_content, extra_secrets=secrets),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s", force=True)
    # Libraries that log SQL parameters or HTTP payloads at debug level would write user content and keys:
    # they stay at warning whatever the gateway's level; what they do log is scrubbed of key-shaped strings.
    for name in _PAYLOAD_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    redactor = Redactor(log_content=log_content, extra_secrets=secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: _scrub_record(record, redactor))


_PAYLOAD_LOGGERS = ("aiosqlite", "sqlalchemy", "asyncpg", "httpx", "httpcore", "hpack", "uvicorn.access")


def _scrub_record(record: logging.LogRecord, redactor: Redactor) -> bool:
    record.msg = redactor.scrub(record.getMessage())
    record.args = None
    return True
