"""What a Prometheus sample may be, and the count of what was dropped (telemetry is total).

Every sample a poll or a backtest reads goes through these checks; one that fails is dropped
(never a reading, never a violation, never a recovery, never an XID) and counted in
:class:`Drops` by ``(metric, reason)``: ``metric`` is the heartbeat (``heartbeat``), ``xid`` or
the signal key of a metric rule (bounded by the policies; never a node name), ``reason`` one of
:data:`REASONS`. A dropped sample affects only its own series: other series of the answer,
other GPUs and other nodes are read as if it were not there.

* ``nan``, ``inf``: the value is NaN or ±Inf (Prometheus writes them as strings);
* ``not-a-number``: the value is not a number at all (``"abc"``, ``null``, an object);
* ``out-of-range``: a number no real exporter sends: an XID code outside 0..:data:`MAX_XID`
  or not an integer, a per-XID count outside 0..:data:`MAX_XID_COUNT`, a temperature outside
  :data:`FIELD_RANGES`, a negative counter, a heartbeat or GPU count that is negative;
* ``bad-time``: the sample's time is not finite or lies outside what the query can return
  (after the evaluation time, or before the start of a range query's window): a stamp from
  the future would otherwise freeze the XID cursor or keep a dead node fresh for ever;
* ``malformed``: the entry is not shaped like a Prometheus series (wrong types, missing keys,
  nested garbage);
* ``bad-answer``: the whole answer was unusable (not JSON, an HTML page, truncated, too
  large, wrong content type, ``status`` not ``success``, ``result`` not a list);
* ``too-many``: more XID occurrences on one GPU in one read than :data:`MAX_XID_EVENTS`
  (a count that jumps by millions); the first ones are reported, the rest are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from healer.core.rules import Aggregation, MetricRule

REASONS = ("nan", "inf", "not-a-number", "out-of-range", "bad-time", "malformed",
           "bad-answer", "too-many")
#: The ``metric`` label of drops of the freshness answers and of the XID answers.
HEARTBEAT = "heartbeat"
XID = "xid"
#: The highest XID code healer reads (the policies accept codes 1..1024 too).
MAX_XID = 1024
#: The highest per-XID count (``DCGM_EXP_XID_ERRORS_COUNT``, a sliding window of minutes)
#: healer reads: a GPU reporting one XID a millisecond for minutes would stay below it.
MAX_XID_COUNT = 100_000
#: The most XID occurrences one GPU reports in one read (a poll, a backtest hour).
MAX_XID_EVENTS = 256
#: The most GPUs a node's ``gpus`` freshness row may count.
MAX_GPUS = 4096
#: How far (seconds) a sample may lie after the evaluation time (rounding to milliseconds).
FUTURE_SLACK = 1.0
#: How far (seconds) before a range query's window a sample may lie (its left edge).
XID_EDGE = 1.0

_INF = math.inf
#: Physically possible values of some DCGM fields (inclusive); counters are never negative.
FIELD_RANGES: Mapping[str, tuple[float, float]] = {
    "DCGM_FI_DEV_GPU_TEMP": (-60.0, 250.0),
    "DCGM_FI_DEV_MEMORY_TEMP": (-60.0, 250.0),
    "DCGM_FI_DEV_POWER_USAGE": (0.0, 10_000.0),
    "DCGM_FI_DEV_GPU_UTIL": (0.0, 100.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (0.0, 100.0),
    # node-exporter's infiniband collector: the port states of /sys/class/infiniband
    "node_infiniband_state_id": (0.0, 5.0),
    "node_infiniband_physical_state_id": (0.0, 7.0),
}
_COUNTER_HINTS = ("_TOTAL", "_COUNT", "_COUNTER", "ECC_", "ROW_REMAP_", "RETIRED_",
                  "_VIOLATION", "XID_ERRORS")


def field_range(field: str) -> tuple[float, float]:
    """The physically possible values of a DCGM field: its :data:`FIELD_RANGES` entry,
    ``[0, inf)`` for a counter, else any finite number."""
    got = FIELD_RANGES.get(field)
    if got is not None:
        return got
    if field.startswith("DCGM_") and any(h in field for h in _COUNTER_HINTS):
        return (0.0, _INF)
    if field.endswith("_total"):  # a Prometheus counter (node_infiniband_link_downed_total)
        return (0.0, _INF)
    return (-_INF, _INF)


def rule_range(rule: MetricRule | None) -> tuple[float, float]:
    """The possible values of a metric rule's query: the field's range for the value and
    ``max_over_time``; ``[0, inf)`` for ``increase``/``rate`` of a counter and for
    ``changes``; any finite number for a ``promql`` rule (healer cannot know what it
    computes)."""
    if rule is None or rule.promql:
        return (-_INF, _INF)
    if rule.aggregation is Aggregation.CHANGES:  # a count of changes
        return (0.0, _INF)
    lo, hi = field_range(rule.field)
    if rule.aggregation in (Aggregation.VALUE, Aggregation.MAX_OVER_TIME):
        return lo, hi
    return (0.0, _INF) if lo >= 0 else (-_INF, _INF)


def why_not_a_number(raw: Any) -> str:
    """The drop reason of a raw sample value that ``float()`` refused or made non-finite."""
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        try:
            v = float(raw)
        except (ValueError, OverflowError):
            return "not-a-number"
        if v != v:
            return "nan"
        if v in (_INF, -_INF):
            return "inf"
        return "out-of-range"
    return "not-a-number"


def value_reason(entry: Any) -> str:
    """Why an instant-vector entry's value was refused."""
    raw = entry.get("value") if isinstance(entry, dict) else None
    if not isinstance(raw, list) or len(raw) < 2:
        return "malformed"
    return why_not_a_number(raw[1])


def point(raw: Any, lo_t: float, hi_t: float, lo: float = -_INF, hi: float = _INF
          ) -> tuple[float, float] | str:
    """``[time, "value"]`` → (time, value), or the reason it is dropped.

    The time must lie in ``[lo_t, hi_t]``, the value be finite and in ``[lo, hi]``."""
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        return "malformed"
    t_raw, v_raw = raw
    if isinstance(t_raw, bool) or not isinstance(t_raw, int | float | str):
        return "bad-time"
    try:
        t = float(t_raw)
    except (ValueError, OverflowError):
        return "bad-time"
    if not lo_t <= t <= hi_t:  # NaN fails too
        return "bad-time"
    if isinstance(v_raw, bool) or not isinstance(v_raw, str | int | float):
        return "not-a-number"
    try:
        v = float(v_raw)
    except (ValueError, OverflowError):
        return "not-a-number"
    if lo <= v <= hi and -_INF < v < _INF:
        return t, v
    return why_not_a_number(v_raw)


def xid_label(raw: Any) -> int | None:
    """A count series' ``xid`` label → its code (1..:data:`MAX_XID`), or None."""
    if not isinstance(raw, str) or not raw.isascii() or not raw.strip().isdigit():
        return None
    code = int(raw)
    return code if 1 <= code <= MAX_XID else None


class Drops:
    """Samples and answers dropped so far, by (metric, reason); cumulative (a counter)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, metric: str, reason: str, n: int = 1) -> None:
        if n <= 0:
            return
        if reason not in REASONS:  # pragma: no cover - a bug, never a new label value
            reason = "malformed"
        key = (metric, reason)
        self.counts[key] = self.counts.get(key, 0) + n

    def series(self) -> dict[tuple[str, str], int]:
        """What to export: the counts, plus a 0 for every reason of the heartbeat and XID
        answers (``rate()`` and alerts see a series before the first drop)."""
        out = {(m, r): 0 for m in (HEARTBEAT, XID) for r in REASONS}
        out.update(self.counts)
        return out

    def total(self) -> int:
        return sum(self.counts.values())

    def of(self, metric: str) -> int:
        return sum(n for (m, _), n in self.counts.items() if m == metric)
