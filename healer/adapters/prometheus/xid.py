"""XID occurrences: raw samples of the last-XID gauge and the per-XID counts → events."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from healer.adapters.prometheus.promql import XID_GAUGE
from healer.adapters.prometheus.sanity import MAX_XID_EVENTS
from healer.core.model import GpuRef


@dataclass(frozen=True, slots=True)
class XidEvent:
    node: str
    gpu: GpuRef
    code: int
    at: float  # the sample (scrape) time
    via: str  # "count" (DCGM_EXP_XID_ERRORS_COUNT) or "last-value" (DCGM_FI_DEV_XID_ERRORS)


@dataclass(slots=True)
class XidCursor:
    """How far one GPU's XID samples were read: the newest sample's time ``t``, the last-XID
    gauge's ``code`` and the per-XID ``counts`` at ``t`` (None: no baseline yet, so the next
    sample sets it and reports nothing)."""

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
    first sample of a GPU only sets the baseline (but see :meth:`baseline`). A per-XID count
    series held by a cursor but absent from a feed holding other series of its GPU is gone
    (its XID left the exporter's count window): it is dropped from the cursor, so the same XID
    coming back counts from 0. Samples must be possible codes and counts (see
    :mod:`~healer.adapters.prometheus.sanity`; the parser drops the others); a series whose
    every sample was dropped is still present. One feed reports at most ``MAX_XID_EVENTS``
    occurrences per GPU (a count that jumps by millions is not millions of signals); how many
    more there were is in ``capped`` (the cursor still moves past them).

    A live poll fetches the raw samples only of the GPUs whose XID series changed (see
    :func:`~healer.adapters.prometheus.promql.xid_prequery_expr`): a cursor is not advanced
    while nothing changes, and stays right, since its GPU's last value and counts are those
    it holds.
    """

    def __init__(self) -> None:
        self._cursors: dict[tuple[str, GpuRef], XidCursor] = {}
        #: GPUs given an implicit baseline in this feed → the previous XID poll's time
        self._implicit: dict[tuple[str, GpuRef], float] = {}
        self.capped = 0  # occurrences over MAX_XID_EVENTS per GPU in the last feed

    def feed(self, series: Iterable[XidSeries], since: float = -math.inf) -> list[XidEvent]:
        gauges: dict[tuple[str, GpuRef], dict[float, float]] = defaultdict(dict)
        counts: dict[tuple[str, GpuRef], dict[float, dict[int, int]]] = defaultdict(dict)
        named: dict[tuple[str, GpuRef], set[int]] = defaultdict(set)
        self.capped = 0
        for s in series:
            key = (s.node, s.gpu)
            if s.xid is not None:
                named[key].add(s.xid)
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
        try:
            return self._advance(gauges, counts, named, since)
        finally:
            self._implicit.clear()

    def _advance(self, gauges: dict[tuple[str, GpuRef], dict[float, float]],
                 counts: dict[tuple[str, GpuRef], dict[float, dict[int, int]]],
                 named: dict[tuple[str, GpuRef], set[int]], since: float) -> list[XidEvent]:
        events: list[XidEvent] = []
        cursors = self._cursors
        implicit = self._implicit
        empty: dict[float, float] = {}
        empty_counts: dict[float, dict[int, int]] = {}
        for key in sorted(gauges.keys() | counts.keys()):
            room = MAX_XID_EVENTS
            cur = cursors.get(key)
            if cur is None:
                cur = cursors[key] = XidCursor()
            g, c = gauges.get(key, empty), counts.get(key, empty_counts)
            if cur.counts and not cur.counts.keys() <= named.get(key, set()):
                # a count series absent from the whole window: its XID left the exporter's
                # count window (the same XID coming back is a rise from 0)
                have = named.get(key, set())
                cur.counts = {k: v for k, v in cur.counts.items() if k in have}
            prev = implicit.get(key)
            if prev is not None:  # the GPU's samples from before the previous poll: baseline
                if g and min(g) <= prev:
                    cur.code = None
                if c and min(c) <= prev:
                    cur.counts = None
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
                    if n > room:
                        self.capped += n - room
                        n = room
                    room -= n
                    events.extend(XidEvent(key[0], key[1], code, t, via) for _ in range(n))
        return events

    def baseline(self, node: str, gpu: GpuRef, previous: float = -math.inf) -> XidCursor:
        """The implicit baseline of a GPU known at the previous completed XID poll (evaluated
        at ``previous``) and never fetched before; applies to the next :meth:`feed`.

        A live poll fetches the raw XID samples only of GPUs the pre-query lists, i.e. with
        something new in the window; a GPU it did not list had nothing new up to that poll,
        but its gauge may have been non-zero for hours (dcgm-exporter keeps the last code) and
        its count series may exist. The window overlaps the previous poll by ``xid_overlap``
        seconds (longer than a scrape interval), so such a GPU's fetch normally holds samples
        at or before ``previous``: its oldest one (gauge and counts apart) is the baseline,
        with no occurrence from it, and every change after it is compared as for any cursor.
        (The oldest, not the newest at or before ``previous``: a sample stamped just before
        the previous poll but ingested after it was never seen, and its change is reported.)
        Only a GPU without such a sample (a new GPU, a restarted exporter, a new count series)
        starts from "last code 0, no counts": its first fetched sample is compared with that,
        and an XID that is already its first sample is still one occurrence (reported once,
        as for any cursor). The default ``previous`` always falls back to that.
        """
        key = (node, gpu)
        cur = self._cursors[key] = XidCursor(-math.inf, 0, {})
        self._implicit[key] = previous
        return cur

    def forget(self, node: str) -> None:
        for key in [k for k in self._cursors if k[0] == node]:
            del self._cursors[key]
