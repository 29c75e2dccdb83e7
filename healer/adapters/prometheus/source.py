"""The DCGM telemetry source (the one source): the poll loop, its queries through the daemon's
client (:mod:`.http`), and the backtest's history (:mod:`.history`, through the offline
client), every query retried by the source's policy (see the package docstring)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from healer.adapters.calls import timed
from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.prometheus.access import Access, check_url
from healer.adapters.prometheus.followup import Pending
from healer.adapters.prometheus.freshness import FreshnessTracker, Transition
from healer.adapters.prometheus.http import BadAnswer, connect, decode_result, gc_paused
from healer.adapters.prometheus.parse import NodeMap, PollParser
from healer.adapters.prometheus.promql import (
    DEFAULT_HEARTBEAT,
    DEFAULT_HOST_LABELS,
    SOURCE,
    XID_GAUGE,
    QueryPlan,
    freshness_expr,
    group_labels,
    node_freshness_expr,
    plan_queries,
    xid_prequery_expr,
)
from healer.adapters.prometheus.rounds import first_round, second_round
from healer.adapters.prometheus.sanity import HEARTBEAT, XID, Drops
from healer.adapters.prometheus.stats import Answer, PollStats
from healer.adapters.prometheus.xid import XidEvent, XidTracker
from healer.adapters.retry import QUICK
from healer.core.model import Signal, SignalKind
from healer.core.rules import PolicySet
from healer.errors import ConfigError, HealerError, PermanentError, TransientError
from healer.ports import Clock, SignalSink

log = structlog.get_logger("healer.adapters.prometheus")

class PrometheusSource:
    """The DCGM telemetry source (``TelemetrySource``) backed by Prometheus' HTTP API.

    ``url`` may be Prometheus, Thanos Query or Mimir/Cortex (``.../prometheus``). ``matchers``
    are added to every generated selector (``{"job": "dcgm"}``, ``{"cluster": "a"}``).
    ``host_labels`` are tried in order for the node name; ``node_map`` (labels → node or None)
    overrides them; ``join`` (e.g. ``* on(namespace, pod) group_left(node) kube_pod_info``) is
    applied to every generated expression, with the joined label listed in ``host_labels``.
    ``stale_after`` is how old a node's newest sample may be (a few scrape intervals);
    ``xid_lookback_on_start`` is how far back the first poll reports XIDs (a restarted healer
    must not miss an XID from just before). ``poll_interval``, ``timeout`` and the lookbacks are
    seconds.
    """

    name = SOURCE

    def __init__(
        self,
        url: str,
        policies: PolicySet,
        *,
        poll_interval: float = 15.0,
        host_labels: Sequence[str] = DEFAULT_HOST_LABELS,
        node_map: NodeMap | None = None,
        join: str = "",
        matchers: Mapping[str, str] | None = None,
        extra_labels: Sequence[str] = (),
        heartbeat: str = DEFAULT_HEARTBEAT,
        stale_after: float = 90.0,
        forget_after: float = 3600.0,
        xid_lookback_on_start: float = 600.0,
        xid_overlap: float = 30.0,
        xid_max_lookback: float = 3600.0,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
        bearer_token_file: str | None = None,
        verify: bool = True,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        max_concurrency: int = 8,
        clock: Clock | None = None,
        source: str = SOURCE,
    ) -> None:
        if not (0 < poll_interval < math.inf and 0 < timeout < math.inf
                and 0 < stale_after < math.inf):
            raise ConfigError("poll_interval, timeout and stale_after must be positive "
                              "finite numbers of seconds")
        self.url = check_url(url).rstrip("/")
        self.name = source
        self.poll_interval = float(poll_interval)
        self.host_labels = tuple(host_labels)
        self.node_map = node_map
        self.join = join
        self.matchers = dict(matchers or {})
        self.extra_labels = tuple(extra_labels)
        self.heartbeat = heartbeat
        self.xid_lookback_on_start = float(xid_lookback_on_start)
        self.xid_overlap = float(xid_overlap)
        self.xid_max_lookback = float(xid_max_lookback)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._retry = QUICK.but(attempts=self.retries + 1, jitter=0.0,
                                budget=self.poll_interval)
        self._metric_by = group_labels(self.host_labels, self.extra_labels)
        self._fresh_by = group_labels(self.host_labels, self.extra_labels, jobs=True)
        #: per GPU (backtests: every GPU's scrape time, ``up == 0``)
        self.gpu_freshness_query = freshness_expr(by=self._fresh_by, heartbeat=heartbeat,
                                                  matchers=self.matchers, join=join)
        #: a live poll's: per node (see the package docstring)
        self.freshness_query = node_freshness_expr(
            by_node=(*self.host_labels, "instance", *self.extra_labels),
            by_gpu=self._metric_by, stale_after=stale_after, heartbeat=heartbeat,
            matchers=self.matchers, join=join)
        #: samples and answers dropped so far, by (metric, reason) (:mod:`.sanity`)
        self.drops = Drops()
        self.parser = PollParser(source, self.host_labels, node_map, self.drops)
        self.plan = self._plan(policies)
        self.freshness = FreshnessTracker(source, stale_after=stale_after,
                                          forget_after=forget_after)
        self.xids = XidTracker()
        self._xid_last_eval: float | None = None
        self._pending: Pending | None = None
        self.polls = 0  # first rounds parsed (spreads the per-GPU inventory refresh)
        self.node_hash: dict[str, int] = {}  # node → crc32 of its name (the refresh's turn)
        self._sem = asyncio.Semaphore(max(1, max_concurrency))
        # its own threads: a slow Prometheus never starves the process' default pool, and
        # other threaded work in the process never delays a poll
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_concurrency) + 1,
                                        thread_name_prefix="healer-prometheus")
        self._logged: set[str] = set()
        # state for metrics/logs
        self.outage = False
        self.outage_since: float | None = None
        self.last_poll: PollStats | None = None
        self.last_success: float | None = None  # evaluation time of the last poll that answered
        self.totals: dict[str, float] = defaultdict(float)

        #: where Prometheus is and how to reach it (both clients are made from it)
        self.access = Access(self.url, self.timeout, dict(headers or {}), bearer_token,
                             bearer_token_file, verify, ca_file, client_cert, source)
        #: the daemon's client (TLS, headers, the bearer token): :mod:`.http`; history reads
        #: go through the offline tools' client (:mod:`.history`, :mod:`.offline`)
        self._http = connect(self.access)

    # -- configuration --------------------------------------------------------------------

    def _plan(self, policies: PolicySet) -> QueryPlan:
        plan = plan_queries(policies, by=self._metric_by, matchers=self.matchers, join=self.join)
        for key in plan.conflicts:
            log.warning("several metric rules share one signal key with different queries; "
                        "their samples cannot be told apart", key=key, source=self.name)
        self.parser.keep_keys({q.key for q in plan.metrics})
        return plan

    def set_policies(self, policies: PolicySet) -> None:
        """Re-derive the queries after a policy reload."""
        self.plan = self._plan(policies)

    @property
    def http_requests(self) -> int:
        """HTTP requests sent to Prometheus so far (retries included)."""
        return self._http.requests

    def node_of(self, labels: Mapping[str, str]) -> str | None:
        return self.parser.node_of(dict(labels))

    def close(self) -> None:
        self._http.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def __aenter__(self) -> PrometheusSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP -----------------------------------------------------------------------------

    async def retried(self, fn: Callable[[], Any], op: str = "query") -> Any:
        """``fn`` (a blocking query) in the source's threads, retried
        (:data:`~healer.adapters.retry.QUICK` with ``retries``, within one poll interval)."""
        async def once() -> Any:
            with timed("prometheus", op):
                return await self._in_thread(fn)

        async with self._sem:
            return await self._retry.run(op, once, clock=self._clock)

    async def query(self, expr: str, at: float, what: str = "") -> list[Any]:
        """One instant query evaluated at ``at``; the ``result`` list (decoded with orjson).
        Re-reads the bearer token file first (as every query outside a poll does)."""
        await self._in_thread(self._http.refresh_token)
        return await self._query(expr, at, what)

    async def _query(self, expr: str, at: float, what: str = "") -> list[Any]:
        label = what or f"query {expr[:120]!r}"
        return list(await self.retried(lambda: self._http.query(expr, at, label)))

    # -- polling --------------------------------------------------------------------------

    def _xid_window(self, now: float) -> tuple[float, float]:
        """(range seconds, report occurrences from) for this poll's XID query."""
        if self._xid_last_eval is None:
            since = now - self.xid_lookback_on_start
            window = max(self.xid_lookback_on_start, self.xid_overlap)
        else:
            since = -math.inf
            window = now - self._xid_last_eval + self.xid_overlap
            if window > self.xid_max_lookback:  # XID answers failed for that long: say so
                self._once("XID samples older than xid_max_lookback are not read",
                           f"no usable XID answer since {self._xid_last_eval:.0f}")
        return min(max(window, 1.0), self.xid_max_lookback), since

    def xid_prequery(self, now: float) -> str:
        return xid_prequery_expr(self._xid_window(_ms(now))[0], by=self._metric_by,
                                 matchers=self.matchers, first=self._xid_last_eval is None)

    def poll_queries(self, now: float) -> list[str]:
        """The first round of a poll at ``now``: freshness, the XID pre-query (if any rule
        needs XIDs), then every metric query of the plan (``q.expr``, server-side filtered).

        The protocol of a caller without HTTP (what :meth:`poll_once` does)::

            exprs = src.poll_queries(now)           # round 1
            while exprs:                            # at most one more round
                signals += src.parse_poll(now, {e: answer(e, at=now) for e in exprs})
                exprs = src.follow_up_queries(now)  # [] when the poll is complete

        Every query is an instant query evaluated at ``now``. A caller that stops after
        round 1 loses nothing for good: owed recoveries and unfetched XIDs come with a later
        poll (the XID window is not advanced until its raw samples were parsed).
        """
        out = [self.freshness_query]
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
        p = self._pending
        return p.exprs if p is not None and p.now == _ms(now) else []

    async def poll_once(self, now: float | None = None) -> list[Signal]:
        """Query the whole fleet once (every query evaluated at ``now``); return the signals.

        Never raises for telemetry trouble: an unreachable Prometheus yields STALE signals.
        """
        now = _ms(self._clock.now() if now is None else float(now))
        started = time.monotonic()
        requests_before = self._http.requests
        try:
            await self._in_thread(self._http.refresh_token)
        except PermanentError as e:
            return self._unreachable(now, started, requests_before, str(e), 0)
        with gc_paused():  # the decoded answers live until parsed: no collection scans them
            names = {q.expr: f"query of {', '.join(q.rules)}" for q in self.plan.metrics}
            names[self.freshness_query] = "freshness query"
            exprs = self.poll_queries(now)
            if self.plan.xid:
                names[exprs[1]] = "XID pre-query"
            signals = self._parse(now, await self._ask(now, exprs, names), started,
                                  requests_before)
            follow = self.follow_up_queries(now)
            if follow:
                p = self._pending
                names = {**dict.fromkeys(p.fresh, "per-GPU freshness query"),
                         **dict.fromkeys(p.xid, "XID query")} if p else {}
                bodies = await self._ask(now, follow, names)
                signals.extend(self._parse_follow_up(now, bodies))
            return signals

    async def _ask(self, now: float, exprs: list[str], names: Mapping[str, str]
                   ) -> dict[str, Answer]:
        results = await asyncio.gather(
            *(self._query(e, now, names.get(e, "recovery query")) for e in exprs),
            return_exceptions=True)
        bodies: dict[str, Answer] = {}
        for expr, r in zip(exprs, results, strict=True):
            if isinstance(r, BaseException) and not isinstance(r, HealerError):
                raise r
            bodies[expr] = r
        return bodies

    def parse_poll(self, now: float, bodies: Mapping[str, Answer]) -> list[Signal]:
        """One round's answers (keyed by the expressions of :meth:`poll_queries` or, for the
        second round, :meth:`follow_up_queries`) → its signals.

        Exactly what :meth:`poll_once` does after its HTTP requests, state included (the
        freshness tracker, the XID cursors, the violating set, ``last_poll``): a benchmark
        or a replay feeds raw bodies here without HTTP. A missing or failed answer counts as
        a failed query. Answers to the pending follow-ups of the poll at ``now`` are its
        second round; anything else starts a new poll (a pending follow-up is dropped).
        """
        now = _ms(now)
        with gc_paused():
            p = self._pending
            if p is not None and p.now == now and any(e in bodies for e in p.exprs):
                return self._parse_follow_up(now, bodies)
            return self._parse(now, bodies, time.monotonic(), self._http.requests)

    def _answer(self, bodies: Mapping[str, Answer], expr: str, what: str
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
            self.drops.add(self._metric_of(expr, what), "bad-answer")
        if isinstance(got, HealerError):
            return got
        if not isinstance(got, list):  # a caller handing a decoded answer of the wrong type
            self.drops.add(self._metric_of(expr, what), "bad-answer")
            return BadAnswer(f"{what}: the answer is a {type(got).__name__}, not a list")
        return got

    def _metric_of(self, expr: str, what: str) -> str:
        """The ``metric`` label of a drop in the answer to ``expr`` (see :mod:`.sanity`)."""
        if "freshness" in what:
            return HEARTBEAT
        if "XID" in what:
            return XID
        for q in self.plan.metrics:
            if q.expr == expr:
                return q.key
        return "recovery"

    def _parse(self, now: float, bodies: Mapping[str, Answer], started: float,
               requests_before: int) -> list[Signal]:
        signals = first_round(self, now, bodies, started, requests_before)
        p = self._pending
        if p is not None and not p.exprs:  # held or deferred, nothing to ask: finish now
            signals.extend(second_round(self, now, {}))
        return signals

    def _parse_follow_up(self, now: float, bodies: Mapping[str, Answer]) -> list[Signal]:
        return second_round(self, now, bodies)

    def xid_signals(self, events: Iterable[XidEvent], parser: PollParser | None = None
                    ) -> list[Signal]:
        detail = (parser or self.parser).detail
        return [Signal(e.node, self.name, SignalKind.XID, XID_GAUGE, float(e.code), e.at, e.gpu,
                       detail(e.node, e.gpu, "via", e.via)) for e in events]

    def _unreachable(self, now: float, started: float, requests_before: int, error: str,
                     failed: int) -> list[Signal]:
        if not self.outage:
            log.warning("prometheus unreachable: telemetry of every node is stale (unknown)",
                        source=self.name, url=self.url, error=error,
                        nodes=len(self.freshness.inventory))
            self.outage, self.outage_since = True, now
        signals = self.freshness.unreachable(now, error)
        n = self.plan.queries_per_poll
        self._record(PollStats(now, time.monotonic() - started, n, failed or n,
                               self._http.requests - requests_before, 0, len(signals), 0, 0,
                               len(signals), 0, 0, True, (error,)))
        return signals

    def _record(self, stats: PollStats) -> None:
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

    def _once(self, message: str, error: str, *, permanent: bool = False) -> str:
        key = f"{message}|{error}"
        if key not in self._logged:
            self._logged.add(key)
            (log.error if permanent else log.warning)(message, source=self.name, error=error)
        return f"{message}: {error}"

    def _log_transitions(self, transitions: Iterable[Transition]) -> None:
        for t in transitions:
            if t.stale:
                log.warning("telemetry stale (unknown, never failed)", source=self.name,
                            node=t.node, reason=t.reason)
            else:
                log.info("telemetry fresh again", source=self.name, node=t.node)

    async def run(self, sink: SignalSink) -> None:
        """Poll every ``poll_interval`` and hand each poll's signals to ``sink``, forever."""
        next_at = self._clock.now()
        while True:
            now = self._clock.now()
            try:
                signals = await self.poll_once(now)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug must not make stale telemetry look healthy
                log.exception("telemetry poll failed", source=self.name)
                signals = self.freshness.unreachable(now, f"poll failed: {e!r}")
            await sink(signals)
            next_at += self.poll_interval
            delay = next_at - self._clock.now()
            if delay < 0:  # fell behind: skip the missed ticks
                next_at = self._clock.now()
                delay = 0.0
            await self._clock.sleep(delay)

    async def check(self) -> None:
        """Run every query once; raise the first :class:`PermanentError` naming its rules."""
        now = self._clock.now()
        await self.query(self.freshness_query, now)
        for q in self.plan.metrics:
            try:
                await self.query(q.expr, now)
            except PermanentError as e:
                raise type(e)(f"{', '.join(q.rules)}: {e}") from e

    async def history(self, start: float, end: float, step: float) -> list[Signal]:
        """The signals the source would have produced over ``[start, end]`` every ``step``
        (unfiltered: every sample; see :func:`~healer.adapters.prometheus.history.history`)."""
        from healer.adapters.prometheus.history import history

        return await history(self, start, end, step)


def _ms(now: float) -> float:
    """Prometheus' resolution: no stamp after ``now``."""
    return math.floor(now * 1000) / 1000

