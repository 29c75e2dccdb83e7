"""Timing and failures of every call healer makes to another system (for ``/metrics``).

Adapters wrap each call in :func:`timed`; the composition root installs the observer (the
metrics), so adapters never import the observability layer. Without an observer, nothing is
recorded. ``operation`` must be low-cardinality (a verb or an endpoint kind, never a name).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: (system, operation, seconds, error kind or None)
Observer = Callable[[str, str, float, "str | None"], None]

_observer: Observer | None = None


def set_observer(fn: Observer | None) -> None:
    global _observer
    _observer = fn


@contextmanager
def timed(system: str, operation: str) -> Iterator[None]:
    """Record how long the body took, and the class of the error it raised, if any."""
    start = time.monotonic()  # how long the call took, in real time (a metric)
    error: str | None = None
    try:
        yield
    except Exception as e:
        error = type(e).__name__
        raise
    finally:
        fn = _observer
        if fn is not None:
            fn(system, operation, time.monotonic() - start, error)
