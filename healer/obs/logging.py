"""structlog: JSON off a TTY, console on one; node/incident/phase bound per worker."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


class _Stderr:
    """Whatever ``sys.stderr`` is at the time of writing (test runners swap it per test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


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
    if json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(lvl),
                        logger_factory=structlog.PrintLoggerFactory(file=out),
                        cache_logger_on_first_use=False)
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=out,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


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
