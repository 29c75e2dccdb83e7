"""structlog: JSON off a TTY, console on one; node/incident/phase bound per worker.

Both modes render exceptions as plain tracebacks (never frame locals, which can hold keys and
tokens) and pass every event through :func:`healer.obs.redact.redact`, by key and by value;
the stdlib handler (libraries' records) redacts its formatted lines the same way.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from healer.obs.redact import redact, redact_text


class _Stderr:
    """Whatever ``sys.stderr`` is at the time of writing (test runners swap it per test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _redact_event(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = redact(event)
    return out


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def setup(level: str = "info", json: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog: JSON off a TTY (or when asked), to ``stream`` (default stderr)."""
    out: Any = stream if stream is not None else _Stderr()
    if json is None:
        json = not out.isatty()
    lvl = getattr(logging, level.upper(), logging.INFO)
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # tracebacks become plain text (no frame locals) before redaction sees them, in both modes
    processors += [structlog.processors.format_exc_info, _redact_event]
    if json:
        processors += [structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback)]
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(lvl),
                        logger_factory=structlog.PrintLoggerFactory(file=out),
                        cache_logger_on_first_use=False)
    # set up again (e.g. when the log file closes): the handler installed last time goes (only
    # that one: handlers others added to the root logger stay)
    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is not None:
        root.removeHandler(_HANDLER)
    _HANDLER = logging.StreamHandler(out)
    _HANDLER.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(_HANDLER)
    root.setLevel(max(lvl, logging.WARNING))


_HANDLER: logging.Handler | None = None


class OnceLogger:
    """Log an outage once and its recovery once (not on every failed poll)."""

    def __init__(self, name: str) -> None:
        self.log = structlog.get_logger(name)
        self.down: dict[str, str] = {}

    def failed(self, what: str, error: str) -> None:
        if what not in self.down:
            self.down[what] = error
            self.log.warning("outage", what=what, error=error)

    def ok(self, what: str) -> None:
        if self.down.pop(what, None) is not None:
            self.log.info("recovered", what=what)
