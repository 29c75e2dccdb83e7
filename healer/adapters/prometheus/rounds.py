"""A source's live poll: what it keeps from one poll to the next, the queries of each round
and the parse of their answers (what :meth:`PrometheusSource.parse_poll` runs).

Round 1: the per-node freshness answer (judges every node whose GPU count matches what is known
of it), the XID pre-query, every metric query (signals of nodes with per-GPU rows; the others'
are deferred) → the follow-ups (:class:`~.followup.Pending`). Round 2: the per-GPU rows of the
nodes that need them first (held FRESH/STALE, inventory, job labels), then the deferred metric
signals, the raw XID samples and the recoveries, all stamped with those rows.

:class:`LivePoll` is handed what it needs by the source that makes it: the source's name and
URL (for logs and errors), how its queries are written (:class:`PollQueries`), the plan (again
after each policy reload), the parser, the freshness tracker, and a count of the HTTP requests
sent (for :class:`~.stats.PollStats`). It keeps the rest: the pending follow-ups, the XID
window's last evaluation, the XID cursors, the outage and the statistics.
"""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from healer.adapters.prometheus.followup import Pending, recovery_queries
from healer.adapters.prometheus.freshness import FreshnessTracker, NodeRows, Transition
from healer.adapters.prometheus.http import BadAnswer, decode_result, gc_paused
from healer.adapters.prometheus.nodes import read_freshness
from healer.adapters.prometheus.parse import PollParser
from healer.adapters.prometheus.promql import (
    QueryPlan,
    freshness_expr,
    host_regexes,
    xid_expr,
    xid_prequery_expr,
)
from healer.adapters.prometheus.sanity import FUTURE_SLACK, HEARTBEAT, XID, XID_EDGE
from healer.adapters.prometheus.stats import Answer, PollStats
from healer.adapters.prometheus.view import PollView
from healer.adapters.prometheus.xid import XidTracker
from healer.core.model import GpuRef, Signal, SignalKind
from healer.errors import HealerError, PermanentError, TransientError

log = structlog.get_logger("healer.adapters.prometheus")


@dataclass(frozen=True, slots=True)
class PollQueries:
    """How a source writes its live poll's queries (see :class:`PrometheusSource`)."""

    freshness_query: str  # round 1's per-node freshness query
    metric_by: tuple[str, ...]  # the labels metric and XID queries aggregate by
    fresh_by: tuple[str, ...]  # the labels per-GPU freshness queries aggregate by
    matchers: Mapping[str, str]
    join: str
    heartbeat: str
    host_labels: tuple[str, ...]
    poll_interval: float
    xid_lookback_on_start: float
    xid_overlap: float
    xid_max_lookback: float


class LivePoll:
    """A source's live poll (see the module)."""

    def __init__(self, name: str, url: str, queries: PollQueries, plan: QueryPlan,
                 parser: PollParser, freshness: FreshnessTracker,
                 requests: Callable[[], int]) -> None:
        self.name = name
        self.url = url
        self.queries = queries
        self.plan = plan
        self.parser = parser
        self.drops = parser.drops
        self.freshness = freshness
        self.requests = requests  # HTTP requests sent so far
        self.xids = XidTracker()
        self.xid_last_eval: float | None = None
        self.pending: Pending | None = None
        self.polls = 0  # first rounds parsed (spreads the per-GPU inventory refresh)
        self.node_hash: dict[str, int] = {}  # node → crc32 of its name (the refresh's turn)
        self.logged: set[str] = set()
        # state for metrics/logs
        self.outage = False
        self.outage_since: float | None = None
        self.last_poll: PollStats | None = None
        self.last_success: float | None = None  # evaluation time of the last poll that answered
        self.totals: dict[str, float] = defaultdict(float)

    # -- the queries ----------------------------------------------------------------------

    def xid_window(self, now: float) -> tuple[float, float]:
        """(range seconds, report occurrences from) for this poll's XID query."""
        q = self.queries
        if self.xid_last_eval is None:
            since = now - q.xid_lookback_on_start
            window = max(q.xid_lookback_on_start, q.xid_overlap)
        else:
            since = -math.inf
            window = now - self.xid_last_eval + q.xid_overlap
            if window > q.xid_max_lookback:  # XID answers failed for that long: say so
                self.once("XID samples older than xid_max_lookback are not read",
                          f"no usable XID answer since {self.xid_last_eval:.0f}")
        return min(max(window, 1.0), q.xid_max_lookback), since

    def xid_prequery(self, now: float) -> str:
        return xid_prequery_expr(self.xid_window(ms(now))[0], by=self.queries.metric_by,
                                 matchers=self.queries.matchers,
                                 first=self.xid_last_eval is None)

    def poll_queries(self, now: float) -> list[str]:
        """The first round of a poll at ``now``: freshness, the XID pre-query (if any rule
        needs XIDs), then every metric query of the plan (``q.expr``, server-side filtered).

        The protocol of a caller without HTTP (what :meth:`PrometheusSource.poll_once`
        does)::

            exprs = src.poll_queries(now)           # round 1
            while exprs:                            # at most one more round
                signals += src.parse_poll(now, {e: answer(e, at=now) for e in exprs})
                exprs = src.follow_up_queries(now)  # [] when the poll is complete

        Every query is an instant query evaluated at ``now``. A caller that stops after
        round 1 loses nothing for good: owed recoveries and unfetched XIDs come with a later
        poll (the XID window is not advanced until its raw samples were parsed).
        """
        out = [self.queries.freshness_query]
        if self.plan.xid:
            out.append(self.xid_prequery(now))
        out.extend(q.expr for q in self.plan.metrics)
        return out

    def follow_up_queries(self, now: float) -> list[str]:
        """The queries the poll at ``now`` still needs after its first round was parsed:
        host-restricted per-GPU freshness rows, raw XID samples, the recovery query (see
        :mod:`.followup`; FRESH/STALE of nodes whose GPU count changed and the metric signals
        of nodes without per-GPU rows come with this round); ``[]``
        when complete. Answer them at ``now`` and hand them to :meth:`parse_poll`."""
        p = self.pending
        return p.exprs if p is not None and p.now == ms(now) else []

    # -- the answers ----------------------------------------------------------------------

    def parse_poll(self, now: float, bodies: Mapping[str, Answer]) -> list[Signal]:
        """One round's answers (keyed by the expressions of :meth:`poll_queries` or, for the
        second round, :meth:`follow_up_queries`) → its signals.

        Exactly what :meth:`PrometheusSource.poll_once` does after its HTTP requests, state
        included (the freshness tracker, the XID cursors, the violating set, ``last_poll``):
        a benchmark or a replay feeds raw bodies here without HTTP. A missing or failed answer
        counts as a failed query. Answers to the pending follow-ups of the poll at ``now``
        are its second round; anything else starts a new poll (a pending follow-up is
        dropped).
        """
        now = ms(now)
        with gc_paused():
            p = self.pending
            if p is not None and p.now == now and any(e in bodies for e in p.exprs):
                return self.second_round(now, bodies)
            # elapsed real time of the parse (a cost, in PollStats), not the daemon's clock
            return self.parse(now, bodies, time.monotonic(), self.requests())

    def parse(self, now: float, bodies: Mapping[str, Answer], started: float,
              requests_before: int) -> list[Signal]:
        """Round 1's answers → signals; round 2 at once when it needs no query."""
        signals = self.first_round(now, bodies, started, requests_before)
        p = self.pending
        if p is not None and not p.exprs:  # held or deferred, nothing to ask: finish now
            signals.extend(self.second_round(now, {}))
        return signals

    def answer(self, bodies: Mapping[str, Answer], expr: str, what: str
               ) -> list[Any] | HealerError:
        got = bodies.get(expr)
        if got is None:
            return TransientError(f"{what}: no answer")
        if isinstance(got, bytes | bytearray | memoryview):
            try:
                return decode_result(bytes(got), what, self.url)
            except HealerError as e:
                got = e
        if isinstance(got, BadAnswer):
            self.drops.add(self.metric_of(expr, what), "bad-answer")
        if isinstance(got, HealerError):
            return got
        if not isinstance(got, list):  # a caller handing a decoded answer of the wrong type
            self.drops.add(self.metric_of(expr, what), "bad-answer")
            return BadAnswer(f"{what}: the answer is a {type(got).__name__}, not a list")
        return got

    def metric_of(self, expr: str, what: str) -> str:
        """The ``metric`` label of a drop in the answer to ``expr`` (see :mod:`.sanity`)."""
        if "freshness" in what:
            return HEARTBEAT
        if "XID" in what:
            return XID
        for q in self.plan.metrics:
            if q.expr == expr:
                return q.key
        return "recovery"

    def unreachable(self, now: float, started: float, requests_before: int, error: str,
                    failed: int) -> list[Signal]:
        if not self.outage:
            log.warning("prometheus unreachable: telemetry of every node is stale (unknown)",
                        source=self.name, url=self.url, error=error,
                        nodes=len(self.freshness.inventory))
            self.outage, self.outage_since = True, now
        signals = self.freshness.unreachable(now, error)
        n = self.plan.queries_per_poll
        self.record(PollStats(now, time.monotonic() - started, n, failed or n,  # its cost
                              self.requests() - requests_before, 0, len(signals), 0, 0,
                              len(signals), 0, 0, True, (error,)))
        return signals

    def record(self, stats: PollStats) -> None:
        self.last_poll = stats
        if not stats.outage:
            self.last_success = stats.at
        t = self.totals
        t["polls"] += 1
        t["failed_polls"] += 1 if stats.outage else 0
        t["queries"] += stats.queries
        t["failed_queries"] += stats.failed_queries
        t["http_requests"] += stats.http_requests
        t["samples"] += stats.samples
        t["signals"] += stats.signals
        t["xid_events"] += stats.xid_events
        t["poll_seconds"] += stats.duration

    def once(self, message: str, error: str, *, permanent: bool = False) -> str:
        key = f"{message}|{error}"
        if key not in self.logged:
            self.logged.add(key)
            (log.error if permanent else log.warning)(message, source=self.name, error=error)
        return f"{message}: {error}"

    def log_transitions(self, transitions: Iterable[Transition]) -> None:
        for t in transitions:
            if t.stale:
                log.warning("telemetry stale (unknown, never failed)", source=self.name,
                            node=t.node, reason=t.reason)
            else:
                log.info("telemetry fresh again", source=self.name, node=t.node)

    # -- the two rounds -------------------------------------------------------------------

    def refresh_due(self, node: str) -> bool:
        """Whether this poll refreshes the node's per-GPU rows: every node once per about
        ``forget_after / 4``, spread over the polls by a hash of its name."""
        period = max(1, int(self.freshness.forget_after / 4 / self.queries.poll_interval))
        if period == 1:
            return True
        crc = self.node_hash.get(node)
        if crc is None:
            crc = self.node_hash[node] = zlib.crc32(node.encode())
        return crc % period == self.polls % period

    def first_round(self, now: float, bodies: Mapping[str, Answer], started: float,
                    requests_before: int) -> list[Signal]:
        """Round 1's answers → its signals and the follow-ups (see the module)."""
        plan, parser, how = self.plan, self.parser, self.queries
        self.pending = None
        errors: list[str] = []
        n_queries = plan.queries_per_poll
        fresh = self.answer(bodies, how.freshness_query, "freshness query")
        if isinstance(fresh, HealerError):
            failed = sum(1 for e in self.poll_queries(now)
                         if isinstance(bodies.get(e), HealerError) or e not in bodies)
            return self.unreachable(now, started, requests_before, str(fresh), failed)
        if self.outage:
            log.info("prometheus reachable again", source=self.name, url=self.url,
                         down_for=round(now - (self.outage_since or now), 1))
            self.outage, self.outage_since = False, None
        self.polls += 1
        parser.malformed = 0
        got = read_freshness(parser, fresh, now)
        unmapped = got.unmapped
        signals, transitions, fetch, held = self.freshness.observe_summary(
            now, got.rows, got.nodes, got.down, lambda n: self.refresh_due(n))
        for node in self.freshness.forgotten:
            parser.forget(node)
            self.node_hash.pop(node, None)
            self.xids.forget(node)
        self.log_transitions(transitions)
        view = PollView(got.rows, got.nodes, defer=True)
        samples = len(fresh)
        failed = xid_events = stale_samples = 0
        window, since = self.xid_window(now)
        pending = Pending(now, view, window, since, fetch=fetch, held=held, nodes=got.nodes)
        if plan.xid:
            res = self.answer(bodies, self.xid_prequery(now), "XID pre-query")
            if isinstance(res, HealerError):
                failed += 1
                errors.append(self.once("XID query failed", str(res),
                                        permanent=isinstance(res, PermanentError)))
            else:
                hosts, bad, flagged = parser.xid_flagged(res)
                unmapped += bad
                samples += len(res)
                fetch.update(n for n in flagged if view.defers(n))
                pending.xid = [xid_expr(window, how.matchers, rx) for rx in host_regexes(hosts)]
                if not pending.xid:
                    self.xid_last_eval = now  # nothing to report anywhere in the window
        for i, q in enumerate(plan.metrics):
            res = self.answer(bodies, q.expr, f"query of {', '.join(q.rules)}")
            if isinstance(res, HealerError):
                failed += 1
                errors.append(self.once("metric query failed", str(res),
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
                                                by=how.metric_by, matchers=how.matchers,
                                                join=how.join)
        if fetch:
            host_of = parser.host_of
            pending.fresh = [
                freshness_expr(by=how.fresh_by, heartbeat=how.heartbeat, matchers=how.matchers,
                               join=how.join, regex=rx, up=False)
                for rx in host_regexes(host_of[n] for n in fetch if n in host_of)]
        if pending.exprs or pending.held or pending.deferred:
            self.pending = pending
        if unmapped and "unmapped" not in self.logged:
            self.logged.add("unmapped")
            log.warning("samples without a node label were ignored", source=self.name,
                            host_labels=list(how.host_labels), count=unmapped)
        if parser.malformed and "malformed" not in self.logged:
            self.logged.add("malformed")
            log.warning("malformed samples (wrong shape, NaN or Inf) were ignored",
                            source=self.name, count=parser.malformed)
        fresh_nodes = sum(1 for s in signals if s.kind is SignalKind.FRESH)
        stale_nodes = len({s.node for s in signals if s.kind is SignalKind.STALE})
        self.record(PollStats(now, time.monotonic() - started, n_queries, failed,  # its cost
                              self.requests() - requests_before, samples, len(signals),
                              xid_events, fresh_nodes, stale_nodes, unmapped, stale_samples,
                              False, tuple(errors), parser.malformed))
        return signals

    def second_round(self, now: float, bodies: Mapping[str, Answer]) -> list[Signal]:
        """The follow-up of the poll at ``now``: per-GPU rows, raw XID samples, recoveries."""
        p = self.pending
        if p is None:
            return []
        self.pending = None
        parser = self.parser
        parser.malformed = 0
        signals: list[Signal] = []
        errors: list[str] = []
        failed = unmapped = samples = xid_events = stale = 0
        rows: NodeRows = {}
        for expr in p.fresh:
            res = self.answer(bodies, expr, "per-GPU freshness query")
            if isinstance(res, HealerError):
                failed += 1
                errors.append(self.once("per-GPU freshness query failed", str(res),
                                        permanent=isinstance(res, PermanentError)))
                continue
            got = read_freshness(parser, res, now)
            unmapped += got.unmapped
            samples += len(res)
            rows.update((n, r) for n, r in got.rows.items() if n in p.fetch)
        sigs, transitions = self.freshness.observe_rows(now, rows, p.held, p.nodes)
        signals.extend(sigs)
        self.log_transitions(transitions)
        fresh_nodes = sum(1 for s in sigs if s.kind is SignalKind.FRESH)
        stale_nodes = len({s.node for s in sigs if s.kind is SignalKind.STALE})
        view = PollView({**p.view.rows, **rows}, p.nodes, defer=False)
        for i, items in sorted(p.deferred.items()):
            if i < len(self.plan.metrics):
                sigs, old = parser.emit(self.plan.metrics[i], items, view)
                signals.extend(sigs)
                stale += old
        if p.xid:
            last = self.xid_last_eval
            known_since = self.freshness.known_since

            def known(node: str, gpu: GpuRef) -> bool:
                first = known_since(node, gpu)
                return last is not None and first is not None and first <= last

            ok = True
            for expr in p.xid:
                res = self.answer(bodies, expr, "XID query")
                if isinstance(res, HealerError):
                    ok = False
                    failed += 1
                    errors.append(self.once("XID query failed", str(res),
                                            permanent=isinstance(res, PermanentError)))
                    continue
                events, bad, n = parser.xid_live(res, self.xids, p.since, known,
                                                 -math.inf if last is None else last,
                                                 now - p.window - XID_EDGE, now + FUTURE_SLACK)
                unmapped += bad
                samples += n
                xid_events += len(events)
                signals.extend(parser.xid_signals(events))
            if ok:
                self.xid_last_eval = now
        for expr in p.recovery:
            res = self.answer(bodies, expr, "recovery query")
            if isinstance(res, HealerError):
                failed += 1
                errors.append(self.once("recovery query failed", str(res),
                                        permanent=isinstance(res, PermanentError)))
                continue
            sigs, bad, old = parser.recovery(self.plan.metrics, res, view, p.owed)
            signals.extend(sigs)
            unmapped += bad
            samples += len(res)
            stale += old
        last_poll = self.last_poll
        if last_poll is not None and last_poll.at == now:
            n = len(p.exprs)
            self.last_poll = dataclasses.replace(
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
            t = self.totals
            t["queries"] += n
            t["failed_queries"] += failed
            t["http_requests"] += n
            t["samples"] += samples
            t["signals"] += len(signals)
            t["xid_events"] += xid_events
        return signals


def ms(now: float) -> float:
    """Prometheus' resolution: no stamp after ``now``."""
    return math.floor(now * 1000) / 1000
