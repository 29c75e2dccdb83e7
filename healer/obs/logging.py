"""structlog: JSON off a TTY, console on one; node/incident/phase bound per worker."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def setup(level: str = "info", json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
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
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
                        cache_logger_on_first_use=False)
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr,
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
