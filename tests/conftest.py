"""Fixtures for every test:

* each test starts from the logging configuration the one before it found (a test that runs
  ``healer`` in-process configures structlog and the root logger, at whatever ``--log-level``
  it was given; that must not decide what the next test can capture);
* nothing the session started is left running (:mod:`tests.processes`): the pytest process
  reaps its orphaned descendants, and at the end of the session every process of its tree
  (or carrying its token) that still runs fails the suite, named, and is stopped.
"""

from __future__ import annotations

import logging
import multiprocessing.resource_tracker
import os
import secrets
from collections.abc import Iterator

import pytest
import structlog

from tests.processes import MARKER, become_subreaper, leftovers, stop


def _helpers() -> set[int]:
    """Processes Python itself keeps for this interpreter (multiprocessing's resource
    tracker): they end with it, not with a test."""
    pid = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    return {pid} if isinstance(pid, int) else set()


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_running() -> Iterator[None]:
    """Fails the session (at the teardown of its last test) when a process the tests started
    still runs once every fixture has stopped what it started."""
    token = secrets.token_hex(8)
    os.environ[MARKER] = token
    subreaper = become_subreaper()
    yield
    found = leftovers(os.getpid(), token, ignore=_helpers())
    if not found:
        return
    survivors = stop(found)
    lines = "\n".join(f"  {f}" for f in found)
    note = f"\n  (still running after SIGKILL: {[s.pid for s in survivors]})" if survivors \
        else " (stopped now)"
    if not subreaper:
        note += "\n  (this kernel refused PR_SET_CHILD_SUBREAPER: orphans went to init)"
    pytest.fail(f"{len(found)} process(es) started by this test session were still running at "
                f"its end; every test must stop what it starts, also when it fails:\n{lines}"
                f"{note}", pytrace=False)


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
