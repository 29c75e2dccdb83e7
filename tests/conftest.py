"""Fixtures for every test: each test starts from the logging configuration the one before it
found (a test that runs ``healer`` in-process configures structlog and the root logger, at
whatever ``--log-level`` it was given; that must not decide what the next test can capture)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
