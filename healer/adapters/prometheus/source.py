"""The DCGM telemetry source (the one source): its settings, the poll loop and its queries
through the daemon's client (:mod:`.http`), every query retried by the source's policy (see
the package docstring). What a live poll keeps between polls, and the parse of its answers, is
its :class:`~.rounds.LivePoll`; the backtest's history reads through a source too
(:mod:`.history`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from healer.adapters.calls import timed
from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.prometheus.access import Access, check_url
from healer.adapters.prometheus.freshness import FreshnessTracker
from healer.adapters.prometheus.http import connect, gc_paused
from healer.adapters.prometheus.parse import NodeMap, PollParser
from healer.adapters.prometheus.promql import (
    DEFAULT_HEARTBEAT,
    DEFAULT_HOST_LABELS,
    SOURCE,
    QueryPlan,
    freshness_expr,
    group_labels,
    node_freshness_expr,
    plan_queries,
)
from healer.adapters.prometheus.rounds import LivePoll, PollQueries, ms
from healer.adapters.prometheus.sanity import Drops
from healer.adapters.prometheus.stats import Answer, PollStats
from healer.adapters.prometheus.xid import XidTracker
from healer.adapters.retry import QUICK
from healer.core.model import Signal
from healer.core.rules import PolicySet
from healer.errors import ConfigError, HealerError, PermanentError
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
        self.freshness = FreshnessTracker(source, stale_after=stale_after,
                                          forget_after=forget_after)
        self._sem = asyncio.Semaphore(max(1, max_concurrency))
        # its own threads: a slow Prometheus never starves the process' default pool, and
        # other threaded work in the process never delays a poll
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_concurrency) + 1,
                                        thread_name_prefix="healer-prometheus")

        #: where Prometheus is and how to reach it (both clients are made from it)
        self.access = Access(self.url, self.timeout, dict(headers or {}), bearer_token,
                             bearer_token_file, verify, ca_file, client_cert, source)
        #: the daemon's client (TLS, headers, the bearer token): :mod:`.http`; history reads
        #: go through the offline tools' client (:mod:`.history`, :mod:`.offline`)
        self._http = connect(self.access)
        #: what the live poll keeps between polls, and the parse of its answers
        self.live = LivePoll(
            source, self.url,
            PollQueries(self.freshness_query, self._metric_by, self._fresh_by,
                        dict(self.matchers), join, heartbeat, self.host_labels,
                        self.poll_interval, self.xid_lookback_on_start, self.xid_overlap,
                        self.xid_max_lookback),
            self._plan(policies), self.parser, self.freshness, lambda: self._http.requests)

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
        self.live.plan = self._plan(policies)

    @property
    def plan(self) -> QueryPlan:
        """The queries every poll sends (one per distinct metric expression, see
        :mod:`.promql`)."""
        return self.live.plan

    @property
    def xids(self) -> XidTracker:
        return self.live.xids

    @property
    def outage(self) -> bool:
        """Whether the last poll found Prometheus unreachable."""
        return self.live.outage

    @property
    def last_poll(self) -> PollStats | None:
        return self.live.last_poll

    @property
    def last_success(self) -> float | None:
        """The evaluation time of the last poll that Prometheus answered."""
        return self.live.last_success

    @property
    def totals(self) -> Mapping[str, float]:
        """What every poll so far did, added up (see :class:`~.stats.PollStats`)."""
        return self.live.totals

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

    def xid_prequery(self, now: float) -> str:
        return self.live.xid_prequery(now)

    def poll_queries(self, now: float) -> list[str]:
        """The first round of a poll at ``now`` (see :meth:`LivePoll.poll_queries
        <.rounds.LivePoll.poll_queries>`, the protocol of a caller without HTTP)."""
        return self.live.poll_queries(now)

    def follow_up_queries(self, now: float) -> list[str]:
        """The second round of the poll at ``now`` (``[]`` when complete; see
        :meth:`LivePoll.follow_up_queries <.rounds.LivePoll.follow_up_queries>`)."""
        return self.live.follow_up_queries(now)

    def parse_poll(self, now: float, bodies: Mapping[str, Answer]) -> list[Signal]:
        """One round's answers → its signals, exactly as :meth:`poll_once` parses them (see
        :meth:`LivePoll.parse_poll <.rounds.LivePoll.parse_poll>`)."""
        return self.live.parse_poll(now, bodies)

    async def poll_once(self, now: float | None = None) -> list[Signal]:
        """Query the whole fleet once (every query evaluated at ``now``); return the signals.

        Never raises for telemetry trouble: an unreachable Prometheus yields STALE signals.
        """
        now = ms(self._clock.now() if now is None else float(now))
        live = self.live
        started = time.monotonic()  # elapsed real time of the poll (a cost, in PollStats)
        requests_before = self._http.requests
        try:
            await self._in_thread(self._http.refresh_token)
        except PermanentError as e:
            return live.unreachable(now, started, requests_before, str(e), 0)
        with gc_paused():  # the decoded answers live until parsed: no collection scans them
            names = {q.expr: f"query of {', '.join(q.rules)}" for q in self.plan.metrics}
            names[self.freshness_query] = "freshness query"
            exprs = live.poll_queries(now)
            if self.plan.xid:
                names[exprs[1]] = "XID pre-query"
            signals = live.parse(now, await self._ask(now, exprs, names), started,
                                 requests_before)
            follow = live.follow_up_queries(now)
            if follow:
                p = live.pending
                names = {**dict.fromkeys(p.fresh, "per-GPU freshness query"),
                         **dict.fromkeys(p.xid, "XID query")} if p else {}
                bodies = await self._ask(now, follow, names)
                signals.extend(live.second_round(now, bodies))
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
