"""Kubernetes timestamps (metav1.Time: RFC 3339, UTC, whole seconds) to and from seconds since
the epoch, and durations as people read them (``90s``, ``5m``, ``2h``, ``7d``). Pure: converts
the times it is given, never reads a clock. Total: no function here raises on any input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The range a timestamp can be written in: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
MIN_SECONDS = -62135596800
MAX_SECONDS = 253402300799


def rfc3339(t: float, *, millis: bool = False) -> str:
    """Seconds since the epoch → ``2024-05-01T12:00:00Z``. Total: never raises. A time past
    the year 9999 (``inf`` included) is written as 9999-12-31T23:59:59Z, one before the year 1
    as 0001-01-01T00:00:00Z, and NaN (or anything that is not a number) as the epoch.

    Whole seconds (the fraction is dropped), as Kubernetes writes them; with ``millis`` (the
    backtest report), the time is rounded to the millisecond and a fraction is kept:
    ``2024-05-01T12:00:00.250Z`` (a whole second is still written without one)."""
    if isinstance(t, int) and not isinstance(t, bool):  # an int too large for a float too
        t = min(max(t, MIN_SECONDS), MAX_SECONDS)
    try:
        t = float(t)
    except (TypeError, ValueError, OverflowError):
        t = 0.0
    if t != t:  # NaN
        t = 0.0
    if millis and MIN_SECONDS <= t <= MAX_SECONDS:
        t = round(t, 3)
        if t != int(t):
            return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    seconds = int(min(max(t, MIN_SECONDS), MAX_SECONDS))
    d = _EPOCH + timedelta(seconds=seconds)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}Z"


def parse_rfc3339(value: Any) -> float | None:
    """An API timestamp (string, or the datetime a typed client returns) → seconds since the
    epoch; None when absent or unreadable."""
    if value is None:
        return None
    try:
        if isinstance(value, datetime):
            return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
        if not isinstance(value, str) or len(value) > 64:
            return None
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def format_duration(seconds: float) -> str:
    """Seconds → ``7d``, ``2h``, ``5m`` or ``90s`` (the largest unit that divides it). Total:
    NaN → ``nan``, ±infinity → ``inf`` / ``-inf``, anything not a number → ``?``."""
    try:
        x = float(seconds)
    except (TypeError, ValueError, OverflowError):
        return "?"
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    s = round(x)
    if s % 86400 == 0 and s >= 86400:
        return f"{s // 86400}d"
    if s % 3600 == 0 and s >= 3600:
        return f"{s // 3600}h"
    if s % 60 == 0 and s >= 60:
        return f"{s // 60}m"
    return f"{s}s"
