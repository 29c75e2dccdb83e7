"""Backtests: what a source would have produced over a past interval (range queries):
:func:`history`, the backtest's history reader.

Unfiltered: every sample of every series becomes a METRIC signal (a replay evaluates rules
itself). Nothing here touches the live poll state (trackers, cursors, violating set). Samples
no exporter sends (outside the queried range, NaN/±Inf, impossible values: see
:mod:`.sanity`) are dropped and counted in the source's ``drops``, as in a live poll. The
queries go through the offline tools' client (:class:`~.offline.OfflineClient`:
prometheus-api-client; ADR 0012), made from the source's :class:`~.access.Access`, in the
source's threads and retried by its policy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from healer.adapters.prometheus.freshness import FreshnessTracker, NodeRows
from healer.adapters.prometheus.labels import labels_of
from healer.adapters.prometheus.offline import OfflineClient
from healer.adapters.prometheus.parse import PollParser
from healer.adapters.prometheus.promql import UP_MARK, xid_expr
from healer.adapters.prometheus.sanity import FUTURE_SLACK, HEARTBEAT, XID, XID_EDGE
from healer.adapters.prometheus.source import PrometheusSource
from healer.adapters.prometheus.xid import XidTracker
from healer.core.model import Signal


async def history(src: PrometheusSource, start: float, end: float, step: float
                  ) -> list[Signal]:
    """The signals ``src`` would have produced over ``[start, end]`` every ``step``.

    Metric rules and freshness use range queries; XIDs use the raw samples (in chunks of
    at most an hour), so every occurrence is found once. Raises TransientError/PermanentError
    when Prometheus cannot answer.
    """
    if end <= start or step <= 0:
        raise ValueError("history needs start < end and a positive step")
    client = OfflineClient(src.access, announce=False)  # the source announced its TLS
    try:
        return await _history(src, client, start, end, step)
    finally:
        client.close()


async def _history(src: PrometheusSource, client: OfflineClient, start: float, end: float,
                   step: float) -> list[Signal]:
    async def query_range(expr: str, a: float, b: float) -> list[Any]:
        what = f"query_range {expr[:120]!r}"
        return list(await src.retried(lambda: client.query_range(expr, a, b, step, what),
                                      "query_range"))

    async def query(expr: str, at: float) -> list[Any]:
        what = f"query {expr[:120]!r}"
        return list(await src.retried(lambda: client.query(expr, at, what)))

    # Prometheus answers at most 11,000 points per series; and a day at most, because
    # timestamp() over a long range gets quadratically slower (a week: 9 s, a day: 0.2 s)
    span = min(step * 10_000, max(step, 86400.0))
    chunks: list[tuple[float, float]] = []
    a = start
    while a < end:
        b = min(a + span, end)
        chunks.append((a, b))
        a = b + step
    parser = PollParser(src.name, src.host_labels, src.node_map, src.drops)
    signals: list[Signal] = []
    # freshness first: it gives every metric sample its node's scrape time
    fresh_at: dict[float, NodeRows] = defaultdict(dict)
    down_at: dict[float, set[str]] = defaultdict(set)
    for a, b in chunks:
        for entry in await query_range(src.gpu_freshness_query, a, b):
            labels = labels_of(entry)
            if labels is None:
                src.drops.add(HEARTBEAT, "malformed")
                continue
            # a heartbeat is a time: never after the sample's own step, nor before 1970
            points = [(t, v) for t, v in parser.points(entry, HEARTBEAT, a - step,
                                                       b + FUTURE_SLACK)
                      if 0 < v <= t + FUTURE_SLACK or UP_MARK in labels]
            if not points:
                continue
            raw_instance = labels.get("instance", "")
            instance = raw_instance if isinstance(raw_instance, str) else ""
            if UP_MARK in labels:
                for t, _ in points:
                    down_at[t].add(instance)
                continue
            node = parser.node_of(labels)
            if node is None:
                continue
            gpu = parser.gpu(labels)
            for t, v in points:
                row = fresh_at[t].get(node)
                if row is None:
                    row = fresh_at[t][node] = (instance, {})
                old = row[1].get(gpu)
                if old is None or v > old:
                    row[1][gpu] = v
    tracker = FreshnessTracker(src.name, stale_after=src.freshness.stale_after,
                               forget_after=src.freshness.forget_after)
    for t in sorted(set(fresh_at) | set(down_at)):
        sigs, _ = tracker.observe_nodes(t, fresh_at.get(t, {}), down_at.get(t, ()))
        signals.extend(sigs)
    for q in src.plan.metrics:
        for a, b in chunks:
            res = await query_range(q.unfiltered, a, b)
            signals.extend(parser.metric_history(q, res, a - step, b + FUTURE_SLACK))
    if src.plan.xid:
        xids = XidTracker()
        a = start - src.xid_overlap  # one sample before start sets the baseline
        while a < end:
            b = min(a + 3600.0, end)
            res = await query(xid_expr(b - a, src.matchers), b)
            series, _ = parser.xid_series(res, a - XID_EDGE, b + FUTURE_SLACK)
            signals.extend(parser.xid_signals(xids.feed(series, since=start)))
            if xids.capped:
                src.drops.add(XID, "too-many", xids.capped)
            a = b
    signals.sort(key=lambda s: (s.observed_at, s.node, s.kind.value))
    return signals
