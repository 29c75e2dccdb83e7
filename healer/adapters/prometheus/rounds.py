"""The parse of a live poll's two rounds (what :meth:`PrometheusSource.parse_poll` runs).

Round 1: the per-node freshness answer (judges every node whose GPU count matches what is known
of it), the XID pre-query, every metric query (signals of nodes with per-GPU rows; the others'
are deferred) → the follow-ups (:class:`~.followup.Pending`). Round 2: the per-GPU rows of the
nodes that need them first (held FRESH/STALE, inventory, job labels), then the deferred metric
signals, the raw XID samples and the recoveries, all stamped with those rows.
"""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from healer.adapters.prometheus.followup import Pending, recovery_queries
from healer.adapters.prometheus.freshness import NodeRows
from healer.adapters.prometheus.nodes import PollView, read_freshness
from healer.adapters.prometheus.promql import freshness_expr, host_regexes, xid_expr
from healer.adapters.prometheus.sanity import FUTURE_SLACK, XID_EDGE
from healer.adapters.prometheus.stats import Answer, PollStats
from healer.core.model import GpuRef, Signal, SignalKind
from healer.errors import HealerError, PermanentError

if TYPE_CHECKING:
    from healer.adapters.prometheus.source import PrometheusSource

log = structlog.get_logger("healer.adapters.prometheus")


def refresh_due(src: PrometheusSource, node: str) -> bool:
    """Whether this poll refreshes the node's per-GPU rows: every node once per about
    ``forget_after / 4``, spread over the polls by a hash of its name."""
    period = max(1, int(src.freshness.forget_after / 4 / src.poll_interval))
    if period == 1:
        return True
    crc = src.node_hash.get(node)
    if crc is None:
        crc = src.node_hash[node] = zlib.crc32(node.encode())
    return crc % period == src.polls % period


def first_round(src: PrometheusSource, now: float, bodies: Mapping[str, Answer],
                started: float, requests_before: int) -> list[Signal]:
    plan, parser = src.plan, src.parser
    src._pending = None
    errors: list[str] = []
    n_queries = plan.queries_per_poll
    fresh = src._answer(bodies, src.freshness_query, "freshness query")
    if isinstance(fresh, HealerError):
        failed = sum(1 for e in src.poll_queries(now)
                     if isinstance(bodies.get(e), HealerError) or e not in bodies)
        return src._unreachable(now, started, requests_before, str(fresh), failed)
    if src.outage:
        log.info("prometheus reachable again", source=src.name, url=src.url,
                     down_for=round(now - (src.outage_since or now), 1))
        src.outage, src.outage_since = False, None
    src.polls += 1
    parser.malformed = 0
    got = read_freshness(parser, fresh, now)
    unmapped = got.unmapped
    signals, transitions, fetch, held = src.freshness.observe_summary(
        now, got.rows, got.nodes, got.down, lambda n: refresh_due(src, n))
    for node in src.freshness.forgotten:
        parser.forget(node)
        src.node_hash.pop(node, None)
        src.xids.forget(node)
    src._log_transitions(transitions)
    view = PollView(got.rows, got.nodes, defer=True)
    samples = len(fresh)
    failed = xid_events = stale_samples = 0
    window, since = src._xid_window(now)
    pending = Pending(now, view, window, since, fetch=fetch, held=held, nodes=got.nodes)
    if plan.xid:
        res = src._answer(bodies, src.xid_prequery(now), "XID pre-query")
        if isinstance(res, HealerError):
            failed += 1
            errors.append(src._once("XID query failed", str(res),
                                    permanent=isinstance(res, PermanentError)))
        else:
            hosts, bad, flagged = parser.xid_flagged(res)
            unmapped += bad
            samples += len(res)
            fetch.update(n for n in flagged if view.defers(n))
            pending.xid = [xid_expr(window, src.matchers, rx) for rx in host_regexes(hosts)]
            if not pending.xid:
                src._xid_last_eval = now  # nothing to report anywhere in the window
    for i, q in enumerate(plan.metrics):
        res = src._answer(bodies, q.expr, f"query of {', '.join(q.rules)}")
        if isinstance(res, HealerError):
            failed += 1
            errors.append(src._once("metric query failed", str(res),
                                    permanent=isinstance(res, PermanentError)))
            continue
        sigs, bad, old, owed, deferred = parser.metric_live(q, res, view)
        signals.extend(sigs)
        unmapped += bad
        samples += len(res)
        stale_samples += old
        if owed:
            pending.owed[i] = set(owed)
            fetch.update(n for n, _ in owed if view.defers(n))
        if deferred:
            pending.deferred[i] = deferred
            fetch.update(n for n, _, _, _ in deferred)
    if pending.owed:
        pending.recovery = recovery_queries(plan.metrics, pending.owed, parser.host_of,
                                            by=src._metric_by, matchers=src.matchers,
                                            join=src.join)
    if fetch:
        host_of = parser.host_of
        pending.fresh = [
            freshness_expr(by=src._fresh_by, heartbeat=src.heartbeat, matchers=src.matchers,
                           join=src.join, regex=rx, up=False)
            for rx in host_regexes(host_of[n] for n in fetch if n in host_of)]
    if pending.exprs or pending.held or pending.deferred:
        src._pending = pending
    if unmapped and "unmapped" not in src._logged:
        src._logged.add("unmapped")
        log.warning("samples without a node label were ignored", source=src.name,
                        host_labels=list(src.host_labels), count=unmapped)
    if parser.malformed and "malformed" not in src._logged:
        src._logged.add("malformed")
        log.warning("malformed samples (wrong shape, NaN or Inf) were ignored",
                        source=src.name, count=parser.malformed)
    fresh_nodes = sum(1 for s in signals if s.kind is SignalKind.FRESH)
    stale_nodes = len({s.node for s in signals if s.kind is SignalKind.STALE})
    src._record(PollStats(now, time.monotonic() - started, n_queries, failed,
                          src.http_requests - requests_before, samples, len(signals),
                          xid_events, fresh_nodes, stale_nodes, unmapped, stale_samples,
                          False, tuple(errors), parser.malformed))
    return signals


def second_round(src: PrometheusSource, now: float, bodies: Mapping[str, Answer]
                 ) -> list[Signal]:
    """The follow-up of the poll at ``now``: per-GPU rows, raw XID samples, recoveries."""
    p = src._pending
    if p is None:
        return []
    src._pending = None
    parser = src.parser
    parser.malformed = 0
    signals: list[Signal] = []
    errors: list[str] = []
    failed = unmapped = samples = xid_events = stale = 0
    rows: NodeRows = {}
    for expr in p.fresh:
        res = src._answer(bodies, expr, "per-GPU freshness query")
        if isinstance(res, HealerError):
            failed += 1
            errors.append(src._once("per-GPU freshness query failed", str(res),
                                    permanent=isinstance(res, PermanentError)))
            continue
        got = read_freshness(parser, res, now)
        unmapped += got.unmapped
        samples += len(res)
        rows.update((n, r) for n, r in got.rows.items() if n in p.fetch)
    sigs, transitions = src.freshness.observe_rows(now, rows, p.held, p.nodes)
    signals.extend(sigs)
    src._log_transitions(transitions)
    fresh_nodes = sum(1 for s in sigs if s.kind is SignalKind.FRESH)
    stale_nodes = len({s.node for s in sigs if s.kind is SignalKind.STALE})
    view = PollView({**p.view.rows, **rows}, p.nodes, defer=False)
    for i, items in sorted(p.deferred.items()):
        if i < len(src.plan.metrics):
            sigs, old = parser.emit(src.plan.metrics[i], items, view)
            signals.extend(sigs)
            stale += old
    if p.xid:
        last = src._xid_last_eval
        known_since = src.freshness.known_since

        def known(node: str, gpu: GpuRef) -> bool:
            first = known_since(node, gpu)
            return last is not None and first is not None and first <= last

        ok = True
        for expr in p.xid:
            res = src._answer(bodies, expr, "XID query")
            if isinstance(res, HealerError):
                ok = False
                failed += 1
                errors.append(src._once("XID query failed", str(res),
                                        permanent=isinstance(res, PermanentError)))
                continue
            events, bad, n = parser.xid_live(res, src.xids, p.since, known,
                                             -math.inf if last is None else last,
                                             now - p.window - XID_EDGE, now + FUTURE_SLACK)
            unmapped += bad
            samples += n
            xid_events += len(events)
            signals.extend(src.xid_signals(events))
        if ok:
            src._xid_last_eval = now
    for expr in p.recovery:
        res = src._answer(bodies, expr, "recovery query")
        if isinstance(res, HealerError):
            failed += 1
            errors.append(src._once("recovery query failed", str(res),
                                    permanent=isinstance(res, PermanentError)))
            continue
        sigs, bad, old = parser.recovery(src.plan.metrics, res, view, p.owed)
        signals.extend(sigs)
        unmapped += bad
        samples += len(res)
        stale += old
    last_poll = src.last_poll
    if last_poll is not None and last_poll.at == now:
        n = len(p.exprs)
        src.last_poll = dataclasses.replace(
            last_poll, queries=last_poll.queries + n,
            failed_queries=last_poll.failed_queries + failed,
            http_requests=last_poll.http_requests + n, samples=last_poll.samples + samples,
            signals=last_poll.signals + len(signals),
            xid_events=last_poll.xid_events + xid_events,
            fresh_nodes=last_poll.fresh_nodes + fresh_nodes,
            stale_nodes=last_poll.stale_nodes + stale_nodes,
            unmapped_samples=last_poll.unmapped_samples + unmapped,
            stale_samples=last_poll.stale_samples + stale,
            errors=last_poll.errors + tuple(errors),
            malformed_samples=last_poll.malformed_samples + parser.malformed,
            rounds=2 if n else last_poll.rounds)
        t = src.totals
        t["queries"] += n
        t["failed_queries"] += failed
        t["http_requests"] += n
        t["samples"] += samples
        t["signals"] += len(signals)
        t["xid_events"] += xid_events
    return signals
