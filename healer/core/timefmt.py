"""healer's one way to write times and durations: timestamps in RFC 3339 (UTC; Kubernetes'
metav1.Time in whole seconds, its MicroTime in microseconds) to and from seconds since the
epoch, and durations as people read them (``45s``, ``5m``, ``1h30m``, ``7d``; what a policy's
durations are written in). Pure: converts the times it is given, never reads a clock. Total:
no function here raises on any input."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The range a timestamp can be written in: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
MIN_SECONDS = -62135596800
MAX_SECONDS = 253402300799


def rfc3339(t: float, *, millis: bool = False, micros: bool = False) -> str:
    """Seconds since the epoch → ``2024-05-01T12:00:00Z``. Total: never raises. A time past
    the year 9999 (``inf`` included) is written as 9999-12-31T23:59:59Z, one before the year 1
    as 0001-01-01T00:00:00Z, and NaN (or anything that is not a number) as the epoch.

    Whole seconds (the fraction is dropped), as Kubernetes writes them; with ``millis`` (the
    backtest report), the time is rounded to the millisecond and a fraction is kept:
    ``2024-05-01T12:00:00.250Z`` (a whole second is still written without one); with
    ``micros``, always six digits of the second, rounded to the microsecond (a Kubernetes
    MicroTime: ``2024-05-01T12:00:00.250000Z``)."""
    if isinstance(t, int) and not isinstance(t, bool):  # an int too large for a float too
        t = min(max(t, MIN_SECONDS), MAX_SECONDS)
    try:
        t = float(t)
    except (TypeError, ValueError, OverflowError):
        t = 0.0
    if t != t:  # NaN
        t = 0.0
    fraction = ""
    if millis and MIN_SECONDS <= t <= MAX_SECONDS:
        t = round(t, 3)
        if t != int(t):
            fraction = f".{round((t - math.floor(t)) * 1000) % 1000:03d}"
    seconds = math.floor(min(max(t, MIN_SECONDS), MAX_SECONDS))
    if micros:
        us = round((t - seconds) * 1_000_000) if MIN_SECONDS <= t < MAX_SECONDS else 0
        if us == 1_000_000:
            seconds, us = seconds + 1, 0
        fraction = f".{us:06d}"
    elif not fraction:
        seconds = int(min(max(t, MIN_SECONDS), MAX_SECONDS))  # toward zero, as it always was
    d = _EPOCH + timedelta(seconds=seconds)
    return (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:"
            f"{d.second:02d}{fraction}Z")


def parse_rfc3339(value: Any) -> float | None:
    """An RFC 3339 timestamp (a string: ``2024-05-01T12:00:00Z``, with a fraction or an offset;
    none means UTC; or the datetime a typed client returns) → seconds since the epoch; None
    when absent or unreadable. Total: never raises, whatever it is given."""
    if value is None:
        return None
    try:
        if isinstance(value, datetime):
            dt = value
        elif isinstance(value, str) and len(value) <= 64:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        else:
            return None
        return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError, OSError, TypeError):
        return None


#: The units a duration is written in, largest first.
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds: float, *, units: int | None = None) -> str:
    """Seconds → ``7d``, ``2h``, ``1h30m``, ``5m``, ``45s``: each unit that is not zero, the
    largest first (what a policy's durations are written in, and read back the same). Under
    ten seconds a fraction is kept to a tenth (``0.4s``, a measured time). ``units``: at most
    that many units from the largest, the rest dropped (``units=2``: ``4d2h``, ``12m30s``; a
    span in a report; ``units=1``: ``4d``, a table's age). Total: NaN → ``nan``, ±infinity →
    ``inf`` / ``-inf``, anything not a number → ``?``."""
    try:
        x = float(seconds)
    except (TypeError, ValueError, OverflowError):
        return "?"
    if x != x:
        return "nan"
    if x in (math.inf, -math.inf):
        return "inf" if x > 0 else "-inf"
    if x < 0:
        return "-" + format_duration(-x, units=units)
    if x < 10 and x != int(x):
        return f"{x:.1f}s"
    s = round(x)
    parts: list[str] = []
    for unit, size in _UNITS:
        if s >= size or parts:
            n, s = divmod(s, size)
            parts.append(f"{n}{unit}" if n else "")
            if units is not None and len(parts) >= units:
                break
    return "".join(parts) or "0s"
