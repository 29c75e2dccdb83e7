"""XID occurrences: raw samples of the last-XID gauge and the per-XID counts → events."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from healer.adapters.prometheus.promql import XID_GAUGE
from healer.core.model import GpuRef


@dataclass(frozen=True, slots=True)
class XidEvent:
    node: str
    gpu: GpuRef
    code: int
    at: float  # the sample (scrape) time
    via: str  # "count" (DCGM_EXP_XID_ERRORS_COUNT) or "last-value" (DCGM_FI_DEV_XID_ERRORS)


@dataclass(slots=True)
class _XidCursor:
    t: float = -math.inf
    code: int | None = None
    counts: dict[int, int] | None = None


@dataclass(frozen=True, slots=True)
class XidSeries:
    """The raw samples of one XID series, with its node and GPU resolved."""

    node: str
    gpu: GpuRef
    metric: str  # XID_GAUGE or XID_COUNT
    xid: int | None  # the ``xid`` label of a count series (None: the GPU's empty series)
    samples: tuple[tuple[float, float], ...]




class XidTracker:
    """Turns raw XID samples into occurrences, each reported once.

    Per GPU it keeps the newest sample time processed, the last XID value and the last counts
    per XID. A sample newer than that is compared with its predecessor: a change of the last
    value to a non-zero code is one occurrence; an increase of a count is that many
    occurrences of its XID (both seen in the same scrape count once, the larger wins). The very
    first sample of a GPU only sets the baseline. Samples must be finite (see
    :func:`~healer.adapters.prometheus.labels.samples`).
    """

    def __init__(self) -> None:
        self._cursors: dict[tuple[str, GpuRef], _XidCursor] = {}

    def feed(self, series: Iterable[XidSeries], since: float = -math.inf) -> list[XidEvent]:
        gauges: dict[tuple[str, GpuRef], dict[float, float]] = defaultdict(dict)
        counts: dict[tuple[str, GpuRef], dict[float, dict[int, int]]] = defaultdict(dict)
        for s in series:
            key = (s.node, s.gpu)
            if s.metric == XID_GAUGE:
                g = gauges[key]
                for t, v in s.samples:
                    old = g.get(t)
                    if old is None or v > old:
                        g[t] = max(v, 0.0)
            else:
                c = counts[key]
                for t, v in s.samples:
                    at = c.setdefault(t, {})
                    if s.xid is not None:
                        at[s.xid] = max(at.get(s.xid, 0), int(v))
        return self._advance(gauges, counts, since)

    def _advance(self, gauges: dict[tuple[str, GpuRef], dict[float, float]],
                 counts: dict[tuple[str, GpuRef], dict[float, dict[int, int]]],
                 since: float) -> list[XidEvent]:
        events: list[XidEvent] = []
        cursors = self._cursors
        empty: dict[float, float] = {}
        empty_counts: dict[float, dict[int, int]] = {}
        for key in sorted(gauges.keys() | counts.keys()):
            cur = cursors.get(key)
            if cur is None:
                cur = cursors[key] = _XidCursor()
            g, c = gauges.get(key, empty), counts.get(key, empty_counts)
            times = g.keys() | c.keys() if c and g else (g.keys() or c.keys())
            for t in sorted(times):
                if t <= cur.t:
                    continue
                occurrences: dict[int, tuple[int, str]] = {}
                if t in c:
                    now_counts = {k: v for k, v in c[t].items() if v > 0}
                    if cur.counts is not None:
                        for code, n in now_counts.items():
                            grew = n - cur.counts.get(code, 0)
                            if grew > 0:
                                occurrences[code] = (grew, "count")
                    cur.counts = now_counts
                if t in g:
                    code = int(g[t])
                    if cur.code is not None and code != cur.code and code != 0 \
                            and code not in occurrences:
                        occurrences[code] = (1, "last-value")
                    cur.code = code
                cur.t = t
                if t < since or not occurrences:
                    continue
                for code, (n, via) in sorted(occurrences.items()):
                    events.extend(XidEvent(key[0], key[1], code, t, via) for _ in range(n))
        return events

    def baseline(self, node: str, gpu: GpuRef) -> _XidCursor:
        """The implicit baseline of a GPU never fetched before: "last code 0, no counts".

        A live poll fetches the raw XID samples only of GPUs the pre-query lists; a GPU it
        did not list had nothing to report (gauge 0, no count series) up to that poll. So a
        GPU known (from the freshness answer) at the last completed XID poll and never
        fetched since starts from code 0 and no counts, before every sample of its first
        fetch: its first fetched sample is compared with that, and an XID that is already
        its first sample is still one occurrence (reported once, as for any cursor).
        """
        cur = self._cursors[(node, gpu)] = _XidCursor(-math.inf, 0, {})
        return cur

    def active(self) -> set[str]:
        """Nodes with a GPU whose cursor holds a non-zero code or counts: fetched every poll
        until they read 0 again (so a return to 0 is never missed)."""
        return {k[0] for k, c in self._cursors.items() if c.code or c.counts}

    def forget(self, node: str) -> None:
        for key in [k for k in self._cursors if k[0] == node]:
            del self._cursors[key]
