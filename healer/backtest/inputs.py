"""What a backtest is asked, parsed: the time range (``--from``/``--to`` as RFC3339, epoch
seconds or ``now-7d``; :func:`check_range` and its limits), durations, node labels, each
refused with a one-line :class:`~healer.errors.ConfigError`. Pure: ``now`` is an argument,
never read here."""

from __future__ import annotations

import math
import re

from healer.core.timefmt import MAX_SECONDS, format_duration, parse_rfc3339, rfc3339
from healer.errors import ConfigError
from healer.policy.schema import parse_duration

#: The labels every node seen in the telemetry gets when no kubeconfig gives the real ones.
DEFAULT_NODE_LABELS = "nvidia.com/gpu.present=true"

_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(\S+))?$")


def parse_time(text: str, now: float) -> float:
    """RFC3339 (``2026-01-05T09:00:00Z``; no offset means UTC), epoch seconds, ``now`` or
    ``now-7d`` / ``now-90m`` / ``now+1h`` → seconds since the epoch."""
    value = text.strip()
    m = _RELATIVE.match(value)
    if m is not None:
        if m.group(1) is None:
            return now
        try:
            delta = parse_duration(m.group(2))
        except ValueError as e:
            raise ConfigError(f"bad time {text!r}: {e}") from None
        return now - delta if m.group(1) == "-" else now + delta
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    t = parse_rfc3339(value)
    if t is None:
        raise ConfigError(f"bad time {text!r}: expected RFC3339 (2026-01-05T09:00:00Z), epoch "
                          "seconds, now or now-7d")
    return t


#: The longest range a backtest reads, and the most evaluation steps it replays: beyond, the
#: fetch or the replay would take hours or exhaust memory; a clear error says so at once.
MAX_RANGE_DAYS = 400
MAX_STEPS = 2_000_000
MIN_STEP = 1.0


def check_range(start: float, end: float, step: float, now: float) -> None:
    """Raise a one-line :class:`ConfigError` unless ``[start, end]`` every ``step`` is a
    range a backtest can read: finite, from 1970 on, not beyond tomorrow, ``start < end``, at
    most :data:`MAX_RANGE_DAYS` days and :data:`MAX_STEPS` steps of at least ``MIN_STEP``."""
    for flag, t in (("--from", start), ("--to", end)):
        if not math.isfinite(t):
            raise ConfigError(f"{flag}: not a finite time")
        if t < 0:
            raise ConfigError(f"{flag}: {_ago(now - t)} ago is before 1970-01-01 (the Unix "
                              "epoch); Prometheus holds nothing older")
        if t > now + 86400:
            when = rfc3339(t, millis=True) if t < MAX_SECONDS else "beyond 9999"
            raise ConfigError(f"{flag}: {when} is in the future")
    if not math.isfinite(step) or step < MIN_STEP:
        raise ConfigError(f"--step: expected at least {MIN_STEP:g}s")
    if end <= start:
        raise ConfigError(f"the backtest range is empty: --to ({rfc3339(end, millis=True)}) "
                          f"must be after --from ({rfc3339(start, millis=True)})")
    days = (end - start) / 86400
    if days > MAX_RANGE_DAYS:
        raise ConfigError(f"--from/--to: the range is {days:,.0f} days; a backtest reads at "
                          f"most {MAX_RANGE_DAYS} days (split it into shorter ranges)")
    steps = (end - start) / step
    if steps > MAX_STEPS:
        raise ConfigError(f"--step: {format_duration(step, units=2)} over "
                          f"{format_duration(end - start, units=2)} "
                          f"is {steps:,.0f} steps; at most {MAX_STEPS:,} (use a larger --step)")


def _ago(seconds: float) -> str:
    return format_duration(seconds, units=1) if seconds < 1e15 else "an absurd time"


def parse_seconds(text: str, what: str) -> float:
    """A duration (``60s``, ``5m``) or a bare number of seconds."""
    value = text.strip()
    try:
        return float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else parse_duration(value)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` → a dict (empty text: no labels)."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad node label {part!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out
