"""DCGM telemetry through Prometheus: PromQL → :class:`~healer.core.model.Signal`.

:class:`PrometheusSource` implements the ``TelemetrySource`` port (``name = "dcgm"``). Every
poll sends a fixed set of **fleet-wide** instant queries, all evaluated at the same time:

* one per distinct metric rule of the policy set: ``increase(FIELD[window])``, ``rate(...)``,
  ``max_over_time(...)`` or the plain gauge, aggregated ``max by`` (``min by`` for ``<``/``<=``
  rules) host, instance and GPU labels; a rule with ``promql`` runs its expression as given.
  Each sample becomes ``Signal(METRIC, key=rule.key, gpu=GpuRef(index, UUID), value)``,
  stamped with the time its GPU was last scraped (an instant query's own timestamp is only the
  evaluation time); samples of a GPU or node with no heartbeat in this poll are dropped (range
  functions still see their old samples), its STALE signal says why;
* one for XIDs (shared by every XID rule): the raw samples of ``DCGM_FI_DEV_XID_ERRORS`` (the
  *last* XID, per GPU) and ``DCGM_EXP_XID_ERRORS_COUNT`` (per XID in a sliding window) since the
  previous poll. A per-GPU cursor turns a change of the last value and every increase of a count
  into one ``Signal(XID, value=code)`` per new occurrence, reported once. A repeated identical
  XID is visible only through the count series (the last value does not change);
* one for freshness: the newest heartbeat sample (``timestamp()``) per node and GPU, plus the
  exporters whose ``up`` is 0.

Stale telemetry is *unknown*, never healthy and never failed: a node whose series are absent
(exporter down, scrape failing, series gone) or older than ``stale_after``, a GPU whose series
vanished, and every known node while Prometheus cannot be queried get ``Signal(STALE,
key=source)``; a node whose data is fresh gets ``Signal(FRESH)``. The outage and its recovery
are logged once each. Node names come from the ``Hostname`` label (released dcgm-exporter) or
``hostname`` (newer builds), or from ``node_map``/``join`` for exporters labelled differently.

The HTTP client is ``prometheus-api-client`` (synchronous, run in threads). Errors are mapped to
:mod:`healer.errors`: connection problems, timeouts, 5xx and 429 are ``TransientError`` (retried
with tenacity within the poll), other 4xx are ``PermanentError`` (a bad ``promql`` rule, bad
credentials).
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
import structlog
import urllib3
from prometheus_api_client import PrometheusConnect
from requests.adapters import Retry
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from healer.adapters.calls import timed
from healer.core.model import GpuRef, Signal, SignalKind
from healer.core.policy import Aggregation, MetricRule, Op, PolicySet, XidRule
from healer.errors import (
    ConfigError,
    ForbiddenError,
    HealerError,
    NotFoundError,
    PermanentError,
    TransientError,
)
from healer.ports import Clock, SignalSink

log = structlog.get_logger(__name__)

SOURCE = "dcgm"
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
#: The series whose presence and sample time say that a GPU's telemetry is fresh.
DEFAULT_HEARTBEAT = "DCGM_FI_DEV_GPU_TEMP"
DEFAULT_HOST_LABELS = ("Hostname", "hostname")
#: Labels that identify a GPU on dcgm-exporter series (``uuid`` with --use-old-namespace;
#: ``DCGM_FI_DEV_SERIAL`` when the serial is exported as a label-type field).
GPU_LABELS = ("gpu", "UUID", "uuid", "DCGM_FI_DEV_SERIAL")
JOB_LABEL = "hpc_job"
_UP_MARK = "healer_up"

NodeMap = Callable[[Mapping[str, str]], str | None]

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


# ---------------------------------------------------------------------------------------------
# PromQL generation (pure)


def duration(seconds: float) -> str:
    """A PromQL duration: ``10m``, ``1h``, ``90s``, ``1500ms``."""
    if seconds <= 0:
        raise ValueError(f"a PromQL duration must be positive, not {seconds}")
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(metric: str, matchers: Mapping[str, str] | None = None) -> str:
    """``metric{k="v",...}`` with the values escaped."""
    if not _METRIC_NAME.match(metric):
        raise ConfigError(f"{metric!r} is not a Prometheus metric name")
    if not matchers:
        return metric
    for k in matchers:
        if not _LABEL_NAME.match(k):
            raise ConfigError(f"{k!r} is not a Prometheus label name")
    return metric + "{" + ",".join(f"{k}={_quote(v)}" for k, v in matchers.items()) + "}"


def group_labels(host_labels: Sequence[str] = DEFAULT_HOST_LABELS,
                 extra: Sequence[str] = (), *, jobs: bool = False) -> tuple[str, ...]:
    """The ``by (...)`` labels: host, ``instance``, GPU identity (+ ``hpc_job``), extras."""
    out: list[str] = []
    for lb in (*host_labels, "instance", *GPU_LABELS, *((JOB_LABEL,) if jobs else ()), *extra):
        if not _LABEL_NAME.match(lb):
            raise ConfigError(f"{lb!r} is not a Prometheus label name")
        if lb not in out:
            out.append(lb)
    return tuple(out)


def metric_expr(rule: MetricRule, *, by: Sequence[str],
                matchers: Mapping[str, str] | None = None, join: str = "") -> str:
    """The fleet-wide PromQL of one metric rule (a ``promql`` rule: its expression as given)."""
    if rule.promql:
        return rule.promql.strip()
    sel = selector(rule.field, matchers)
    match rule.aggregation:
        case Aggregation.VALUE:
            inner = sel
        case Aggregation.INCREASE:
            inner = f"increase({sel}[{duration(rule.window)}])"
        case Aggregation.RATE:
            inner = f"rate({sel}[{duration(rule.window)}])"
        case Aggregation.MAX_OVER_TIME:
            inner = f"max_over_time({sel}[{duration(rule.window)}])"
    if join:
        inner = f"({inner}) {join.strip()}"
    agg = "min" if rule.op in (Op.LT, Op.LE) else "max"
    return f"{agg} by ({', '.join(by)}) ({inner})"


def xid_expr(window: float, matchers: Mapping[str, str] | None = None) -> str:
    """The raw samples of both XID series over ``window`` seconds (a range-vector query)."""
    parts = [f'__name__=~"{XID_GAUGE}|{XID_COUNT}"']
    for k, v in (matchers or {}).items():
        if not _LABEL_NAME.match(k):
            raise ConfigError(f"{k!r} is not a Prometheus label name")
        parts.append(f"{k}={_quote(v)}")
    return "{" + ",".join(parts) + "}" + f"[{duration(window)}]"


def freshness_expr(*, by: Sequence[str], heartbeat: str = DEFAULT_HEARTBEAT,
                   matchers: Mapping[str, str] | None = None, join: str = "") -> str:
    """Newest heartbeat sample time per GPU, plus every failing scrape target (``up == 0``)."""
    inner = f"timestamp({selector(heartbeat, matchers)})"
    if join:
        inner = f"({inner}) {join.strip()}"
    up = selector("up", matchers)
    return (f"max by ({', '.join(by)}) ({inner}) or "
            f'label_replace({up} == 0, "{_UP_MARK}", "0", "", "")')


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One metric query of a poll and the rules it serves."""

    key: str  # the Signal key (MetricRule.key)
    expr: str
    op: Op
    rules: tuple[str, ...]  # "policy/rule"


@dataclass(frozen=True, slots=True)
class QueryPlan:
    metrics: tuple[PlannedQuery, ...]
    xid: bool  # the policy set has XID rules
    conflicts: tuple[str, ...] = ()  # keys served by more than one expression

    @property
    def queries_per_poll(self) -> int:
        """HTTP queries one poll sends: the metric queries, the XID query, freshness."""
        return len(self.metrics) + (1 if self.xid else 0) + 1


def plan_queries(policies: PolicySet, *, by: Sequence[str],
                 matchers: Mapping[str, str] | None = None, join: str = "") -> QueryPlan:
    """One query per distinct metric expression of every policy, one XID query if needed."""
    exprs: dict[str, tuple[str, Op, list[str]]] = {}
    keys: dict[str, set[str]] = defaultdict(set)
    xid = False
    for policy in policies.policies:
        for rule in policy.rules:
            if isinstance(rule, XidRule):
                xid = True
            elif isinstance(rule, MetricRule):
                expr = metric_expr(rule, by=by, matchers=matchers, join=join)
                entry = exprs.setdefault(expr, (rule.key, rule.op, []))
                entry[2].append(f"{policy.name}/{rule.name}")
                keys[rule.key].add(expr)
    metrics = tuple(PlannedQuery(key, expr, op, tuple(rules))
                    for expr, (key, op, rules) in exprs.items())
    conflicts = tuple(sorted(k for k, e in keys.items() if len(e) > 1))
    return QueryPlan(metrics, xid, conflicts)


# ---------------------------------------------------------------------------------------------
# Labels


def node_name(labels: Mapping[str, str],
              host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> str | None:
    """The node of a series: the first non-empty host label (``Hostname`` or ``hostname``)."""
    for lb in host_labels:
        v = labels.get(lb, "").strip()
        if v:
            return v
    return None


def gpu_ref(labels: Mapping[str, str]) -> GpuRef | None:
    """The GPU of a series (``gpu`` index, ``UUID``/``uuid``, serial label); None if none."""
    index_text = labels.get("gpu", "").strip()
    uuid = (labels.get("UUID") or labels.get("uuid") or "").strip()
    if not index_text and not uuid:
        return None
    try:
        index = int(index_text) if index_text else -1
    except ValueError:
        index = -1
    return GpuRef(index, uuid, labels.get("DCGM_FI_DEV_SERIAL", "").strip())


def _sample(entry: Mapping[str, Any]) -> tuple[float, float] | None:
    raw = entry.get("value")
    if not isinstance(raw, (list, tuple)) or len(raw) != 2:
        return None
    try:
        t, v = float(raw[0]), float(raw[1])
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else (t, v)


def _samples(entry: Mapping[str, Any]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for raw in entry.get("values") or ():
        try:
            t, v = float(raw[0]), float(raw[1])
        except (TypeError, ValueError, IndexError):
            continue
        if not math.isnan(v):
            out.append((t, v))
    return out


# ---------------------------------------------------------------------------------------------
# XID occurrences


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
    first sample of a GPU only sets the baseline.
    """

    def __init__(self) -> None:
        self._cursors: dict[tuple[str, GpuRef], _XidCursor] = {}

    def feed(self, series: Iterable[XidSeries], since: float = -math.inf) -> list[XidEvent]:
        gauges: dict[tuple[str, GpuRef], dict[float, float]] = defaultdict(dict)
        counts: dict[tuple[str, GpuRef], dict[float, dict[int, int]]] = defaultdict(dict)
        for s in series:
            key = (s.node, s.gpu)
            for t, v in s.samples:
                if s.metric == XID_GAUGE:
                    gauges[key][t] = max(gauges[key].get(t, 0.0), v)
                else:
                    at = counts[key].setdefault(t, {})
                    if s.xid is not None:
                        at[s.xid] = max(at.get(s.xid, 0), int(v))
        events: list[XidEvent] = []
        for key in sorted(set(gauges) | set(counts)):
            cur = self._cursors.setdefault(key, _XidCursor())
            g, c = gauges.get(key, {}), counts.get(key, {})
            for t in sorted(set(g) | set(c)):
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
                if t < since:
                    continue
                for code, (n, via) in sorted(occurrences.items()):
                    events.extend(XidEvent(key[0], key[1], code, t, via) for _ in range(n))
        return events

    def forget(self, node: str) -> None:
        for key in [k for k in self._cursors if k[0] == node]:
            del self._cursors[key]


# ---------------------------------------------------------------------------------------------
# Freshness and staleness


@dataclass(frozen=True, slots=True)
class FreshRow:
    """The newest heartbeat sample of one GPU (``gpu=None``: a node-level series)."""

    node: str
    instance: str
    gpu: GpuRef | None
    ts: float
    jobs: tuple[str, ...] = ()


@dataclass(slots=True)
class _NodeInventory:
    instance: str = ""
    last_seen: float = 0.0
    gpus: dict[GpuRef, float] = field(default_factory=dict)  # GPU → poll time last seen
    stale: bool | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    node: str
    stale: bool
    reason: str


class FreshnessTracker:
    """Knows every node and GPU seen so far and says, per poll, which are fresh or stale.

    A node is fresh when its newest heartbeat is at most ``stale_after`` old and none of its
    known GPUs is missing; otherwise it is stale with a reason: ``exporter-down`` (its target's
    ``up`` is 0), ``series-missing`` (absent though the target is up, or unknown), ``series-old``
    (Prometheus holds only old samples: a scrape gap, Prometheus restarted), ``gpu-missing``
    (one GPU's series vanished) or ``prometheus-unreachable``. Nodes and GPUs not seen for
    ``forget_after`` seconds are forgotten (a GPU replaced at the same index at once).
    """

    def __init__(self, source: str = SOURCE, *, stale_after: float = 90.0,
                 forget_after: float = 3600.0) -> None:
        self.source = source
        self.stale_after = stale_after
        self.forget_after = forget_after
        self.inventory: dict[str, _NodeInventory] = {}

    @property
    def nodes(self) -> list[str]:
        return sorted(self.inventory)

    def _stale(self, node: str, now: float, reason: str, gpu: GpuRef | None = None,
               **detail: str) -> Signal:
        return Signal(node, self.source, SignalKind.STALE, self.source, 0.0, now, gpu,
                      Signal.details(reason=reason, **detail))

    def observe(self, now: float, rows: Sequence[FreshRow],
                down_instances: Iterable[str] = ()) -> tuple[list[Signal], list[Transition]]:
        down = set(down_instances)
        by_node: dict[str, list[FreshRow]] = defaultdict(list)
        for r in rows:
            by_node[r.node].append(r)
        signals: list[Signal] = []
        states: dict[str, tuple[bool, str]] = {}
        for node, node_rows in sorted(by_node.items()):
            inv = self.inventory.setdefault(node, _NodeInventory())
            inv.instance = node_rows[0].instance or inv.instance
            inv.last_seen = now
            newest: dict[GpuRef | None, float] = {}
            for r in node_rows:
                newest[r.gpu] = max(newest.get(r.gpu, -math.inf), r.ts)
            present = {g for g in newest if g is not None}
            for g in present:
                inv.gpus[g] = now
            indices = {g.index for g in present if g.index >= 0}
            for g in [g for g in inv.gpus if g not in present and g.index in indices]:
                del inv.gpus[g]  # replaced: another UUID now answers at that index
            age = now - max(newest.values())
            if age > self.stale_after:
                signals.append(self._stale(node, now, "series-old", age=f"{age:.1f}",
                                           instance=inv.instance))
                states[node] = (True, "series-old")
                continue
            missing: list[tuple[GpuRef, str]] = []
            for g in sorted(inv.gpus):
                ts = newest.get(g)
                if ts is None:
                    missing.append((g, "gpu-missing"))
                elif now - ts > self.stale_after:
                    missing.append((g, "series-old"))
            for g, why in missing:
                signals.append(self._stale(node, now, why, g, instance=inv.instance))
            if missing:
                states[node] = (True, missing[0][1])
            else:
                signals.append(Signal(node, self.source, SignalKind.FRESH, self.source, 1.0,
                                      now))
                states[node] = (False, "")
        self._forget(now)
        for node, inv in sorted(self.inventory.items()):
            if node in by_node:
                continue
            reason = "exporter-down" if inv.instance and inv.instance in down \
                else "series-missing"
            signals.append(self._stale(node, now, reason, instance=inv.instance))
            states[node] = (True, reason)
        return signals, self._transitions(states)

    def unreachable(self, now: float, error: str) -> list[Signal]:
        """Prometheus could not be queried: every known node is stale (unknown).

        The per-node state is left as it was, so that the recovery reports only the nodes
        whose state really changed (the outage itself is logged once, by the source).
        """
        return [self._stale(n, now, "prometheus-unreachable", error=error[:200])
                for n in sorted(self.inventory)]

    def _transitions(self, states: Mapping[str, tuple[bool, str]]) -> list[Transition]:
        out: list[Transition] = []
        for node, (stale, reason) in states.items():
            inv = self.inventory.get(node)
            if inv is None:
                continue
            if inv.stale != stale and (stale or inv.stale is not None):
                out.append(Transition(node, stale, reason))
            inv.stale, inv.reason = stale, reason
        return out

    def _forget(self, now: float) -> None:
        for node, inv in list(self.inventory.items()):
            if now - inv.last_seen > self.forget_after:
                del self.inventory[node]
                continue
            for g, seen in list(inv.gpus.items()):
                if now - seen > self.forget_after:
                    del inv.gpus[g]


# ---------------------------------------------------------------------------------------------
# The source


@dataclass(frozen=True, slots=True)
class PollStats:
    """What one poll did, for metrics and logs."""

    at: float  # the poll's evaluation time
    duration: float  # wall seconds the poll took
    queries: int
    failed_queries: int
    http_requests: int
    samples: int
    signals: int
    xid_events: int
    fresh_nodes: int
    stale_nodes: int
    unmapped_samples: int  # samples without a node label (see host_labels / node_map)
    stale_samples: int  # samples of nodes without a heartbeat in this poll (dropped)
    outage: bool
    errors: tuple[str, ...] = ()


class _WallClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _HttpStatus(Exception):
    def __init__(self, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        self.retry_after = retry_after


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
        if poll_interval <= 0 or timeout <= 0 or stale_after <= 0:
            raise ConfigError("poll_interval, timeout and stale_after must be positive")
        self.url = url.rstrip("/")
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
        self._clock: Clock = clock if clock is not None else _WallClock()
        self._metric_by = group_labels(self.host_labels, self.extra_labels)
        self._fresh_by = group_labels(self.host_labels, self.extra_labels, jobs=True)
        self.freshness_query = freshness_expr(by=self._fresh_by, heartbeat=heartbeat,
                                              matchers=self.matchers, join=join)
        self.plan = self._plan(policies)
        self.freshness = FreshnessTracker(source, stale_after=stale_after,
                                          forget_after=forget_after)
        self.xids = XidTracker()
        self._xid_last_eval: float | None = None
        self._sem = asyncio.Semaphore(max(1, max_concurrency))
        # its own threads: a slow Prometheus never starves the process' default pool, and
        # other threaded work in the process never delays a poll
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_concurrency) + 1,
                                        thread_name_prefix="healer-prometheus")
        self._count_lock = threading.Lock()
        self._http_requests = 0
        self._logged: set[str] = set()
        self._token_file = Path(bearer_token_file) if bearer_token_file else None
        self._jobs: dict[tuple[str, GpuRef], tuple[str, ...]] = {}
        # state for metrics/logs
        self.outage = False
        self.outage_since: float | None = None
        self.last_poll: PollStats | None = None
        self.last_success: float | None = None  # evaluation time of the last poll that answered
        self.totals: dict[str, float] = defaultdict(float)

        session = requests.Session()
        session.verify = ca_file if ca_file else verify
        if not verify and not ca_file:
            # the operator chose this; one log line instead of a warning on every request
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            log.warning("TLS certificate verification is off", source=source, url=self.url)
        if client_cert is not None:
            session.cert = client_cert
        session.hooks["response"].append(self._on_response)
        hdrs = dict(headers or {})
        if bearer_token:
            hdrs["Authorization"] = f"Bearer {bearer_token}"
        self._session = session
        self._client = PrometheusConnect(url=self.url, headers=hdrs, session=session,
                                         retry=Retry(total=0, raise_on_status=False))

    # -- configuration --------------------------------------------------------------------

    def _plan(self, policies: PolicySet) -> QueryPlan:
        plan = plan_queries(policies, by=self._metric_by, matchers=self.matchers, join=self.join)
        for key in plan.conflicts:
            log.warning("several metric rules share one signal key with different queries; "
                        "their samples cannot be told apart", key=key, source=self.name)
        return plan

    def set_policies(self, policies: PolicySet) -> None:
        """Re-derive the queries after a policy reload."""
        self.plan = self._plan(policies)

    @property
    def http_requests(self) -> int:
        """HTTP requests sent to Prometheus so far (retries included)."""
        return self._http_requests

    def close(self) -> None:
        self._client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def __aenter__(self) -> PrometheusSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP -----------------------------------------------------------------------------

    def _on_response(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if response.status_code != 200:
            body = response.text[:500]
            retry_after: float | None = None
            with_header = response.headers.get("Retry-After")
            if with_header:
                try:
                    retry_after = float(with_header)
                except ValueError:
                    retry_after = None
            raise _HttpStatus(response.status_code, body, retry_after)

    def _headers_refresh(self) -> None:
        if self._token_file is None:
            return
        try:
            token = self._token_file.read_text().strip()
        except OSError as e:
            raise PermanentError(f"cannot read the bearer token file: {e}") from e
        headers = dict(self._client.headers or {})
        headers["Authorization"] = f"Bearer {token}"
        self._client.headers = headers

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        with self._count_lock:
            self._http_requests += 1
        try:
            return fn()
        except _HttpStatus as e:
            raise _map_status(e, what) from None
        except requests.exceptions.SSLError as e:  # retrying cannot fix a certificate
            raise PermanentError(f"{what}: TLS with {self.url} failed: {_root_cause(e)}") from e
        except requests.Timeout as e:
            raise TransientError(f"{what}: timed out after {self.timeout:g}s") from e
        except requests.ConnectionError as e:
            raise TransientError(f"{what}: cannot connect to {self.url}: "
                                 f"{_root_cause(e)}") from e
        except ValueError as e:  # not JSON (requests' JSONDecodeError too): a proxy's page
            raise TransientError(f"{what}: unexpected answer from {self.url}: {e}") from e
        except requests.RequestException as e:
            raise TransientError(f"{what}: {e}") from e
        except (KeyError, TypeError) as e:
            raise TransientError(f"{what}: malformed answer from {self.url}: {e!r}") from e

    async def _retrying(self, fn: Callable[[], Any], what: str, op: str = "query") -> Any:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1) | stop_after_delay(self.poll_interval),
            wait=wait_exponential(multiplier=0.1, max=1.0),
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )
        async with self._sem:
            async for attempt in retrying:
                with attempt, timed("prometheus", op):
                    return await self._in_thread(self._call, fn, what)
        raise AssertionError("unreachable")  # pragma: no cover

    async def query(self, expr: str, at: float, what: str = "") -> list[dict[str, Any]]:
        """One instant query evaluated at ``at``; the ``result`` list."""
        params = {"time": f"{at:.3f}"}

        def run() -> Any:
            return self._client.custom_query(query=expr, params=params, timeout=self.timeout)

        result = await self._retrying(run, what or f"query {expr[:120]!r}")
        return list(result or [])

    async def query_range(self, expr: str, start: float, end: float, step: float,
                          what: str = "") -> list[dict[str, Any]]:
        def run() -> Any:
            return self._client.custom_query_range(
                query=expr, start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC), step=f"{step:g}",
                timeout=self.timeout)

        result = await self._retrying(run, what or f"query_range {expr[:120]!r}", "query_range")
        return list(result or [])

    # -- parsing --------------------------------------------------------------------------

    def node_of(self, labels: Mapping[str, str]) -> str | None:
        if self.node_map is not None:
            mapped = self.node_map(labels)
            if mapped:
                return mapped
        return node_name(labels, self.host_labels)

    def _fresh_rows(self, result: Sequence[Mapping[str, Any]]
                    ) -> tuple[list[FreshRow], set[str], int]:
        rows: list[FreshRow] = []
        down: set[str] = set()
        unmapped = 0
        for entry in result:
            labels = entry.get("metric") or {}
            sample = _sample(entry)
            if sample is None:
                continue
            if _UP_MARK in labels:
                down.add(labels.get("instance", ""))
                continue
            node = self.node_of(labels)
            if node is None:
                unmapped += 1
                continue
            job = labels.get(JOB_LABEL, "")
            rows.append(FreshRow(node, labels.get("instance", ""), gpu_ref(labels), sample[1],
                                 (job,) if job else ()))
        return rows, down, unmapped

    def _heartbeats(self, rows: Iterable[FreshRow]) -> Callable[[str, GpuRef | None],
                                                                 float | None]:
        """When each GPU (and node) was last scraped: the stamp of its metric samples.

        A GPU is matched by its full identity, else by its index (a ``promql`` rule's result
        may lack the UUID); a node-level sample takes the node's newest scrape. None: no
        heartbeat now (exporter down, GPU missing), so the sample is not fresh data.
        """
        per_gpu: dict[tuple[str, GpuRef], float] = {}
        per_index: dict[tuple[str, int], float] = {}
        per_node: dict[str, float] = {}
        jobs: dict[tuple[str, GpuRef], set[str]] = defaultdict(set)
        for r in rows:
            per_node[r.node] = max(per_node.get(r.node, -math.inf), r.ts)
            if r.gpu is None:
                continue
            per_gpu[(r.node, r.gpu)] = max(per_gpu.get((r.node, r.gpu), -math.inf), r.ts)
            if r.gpu.index >= 0:
                k = (r.node, r.gpu.index)
                per_index[k] = max(per_index.get(k, -math.inf), r.ts)
            jobs[(r.node, r.gpu)].update(r.jobs)
        self._jobs = {k: tuple(sorted(v)) for k, v in jobs.items() if v}

        def stamp(node: str, gpu: GpuRef | None) -> float | None:
            if gpu is None or (gpu.index < 0 and not gpu.uuid):
                return per_node.get(node)
            exact = per_gpu.get((node, gpu))
            if exact is not None:
                return exact
            if gpu.index >= 0:
                return per_index.get((node, gpu.index))
            return None

        return stamp

    def _detail(self, node: str, gpu: GpuRef | None, **kw: str) -> tuple[tuple[str, str], ...]:
        jobs = self._jobs.get((node, gpu)) if gpu is not None else None
        if jobs:
            kw[JOB_LABEL] = ",".join(jobs)
        return Signal.details(**kw)

    def _metric_signals(self, q: PlannedQuery, result: Sequence[Mapping[str, Any]],
                        stamp: Callable[[str, GpuRef | None], float | None] | None = None,
                        ) -> tuple[list[Signal], int, int, int]:
        """Samples → METRIC signals, one per node and GPU (the worst of duplicate series).

        Live (``stamp`` given): a sample is stamped with its GPU's newest scrape time (the
        instant query's own timestamp is only the evaluation time), and samples of a GPU or
        node without a heartbeat in this poll are dropped. History: one signal per node, GPU and
        range-query step. Returns (signals, unmapped, samples, dropped as stale).
        """
        # node, GPU → slot → (time, value); a slot is a range step (history) or None (live)
        best: dict[tuple[str, GpuRef | None], dict[float | None, tuple[float, float]]] = {}
        unmapped = 0
        samples = 0
        stale = 0
        for entry in result:
            labels = entry.get("metric") or {}
            node = self.node_of(labels)
            if node is None:
                unmapped += 1
                continue
            gpu = gpu_ref(labels)
            scraped: float | None = None
            if stamp is not None:
                scraped = stamp(node, gpu)
                if scraped is None:
                    # no heartbeat from it now: range functions (increase, rate, ...) still see
                    # old samples, but they say nothing fresh; the STALE signal says why
                    stale += 1
                    continue
            if "value" in entry:
                one = _sample(entry)
                points = [one] if one is not None else []
            else:
                points = _samples(entry)
            slots = best.setdefault((node, gpu), {})
            for t, v in points:
                samples += 1
                slot: float | None = t
                if scraped is not None:
                    slot, t = None, scraped
                old = slots.get(slot)
                if old is None or _worse(q.op, v, old[1]):
                    slots[slot] = (t, v)
        rule = ",".join(q.rules)
        signals: list[Signal] = []
        for (node, gpu), slots in best.items():
            detail = self._detail(node, gpu, rule=rule)  # once per series, not per point
            signals.extend(Signal(node, self.name, SignalKind.METRIC, q.key, v, t, gpu, detail)
                           for t, v in slots.values())
        return signals, unmapped, samples, stale

    def _xid_series(self, result: Sequence[Mapping[str, Any]]) -> tuple[list[XidSeries], int]:
        out: list[XidSeries] = []
        unmapped = 0
        for entry in result:
            labels = entry.get("metric") or {}
            node = self.node_of(labels)
            gpu = gpu_ref(labels)
            if node is None or gpu is None:
                unmapped += 1
                continue
            metric = labels.get("__name__", "")
            if metric not in (XID_GAUGE, XID_COUNT):
                continue
            xid: int | None = None
            if metric == XID_COUNT and labels.get("xid"):
                try:
                    xid = int(labels["xid"])
                except ValueError:
                    continue
            out.append(XidSeries(node, gpu, metric, xid, tuple(_samples(entry))))
        return out, unmapped

    def _xid_signals(self, events: Iterable[XidEvent]) -> list[Signal]:
        return [Signal(e.node, self.name, SignalKind.XID, XID_GAUGE, float(e.code), e.at, e.gpu,
                       self._detail(e.node, e.gpu, via=e.via)) for e in events]

    # -- polling --------------------------------------------------------------------------

    def _xid_window(self, now: float) -> tuple[float, float]:
        """(range seconds, report occurrences from) for this poll's XID query."""
        if self._xid_last_eval is None:
            since = now - self.xid_lookback_on_start
            window = max(self.xid_lookback_on_start, self.xid_overlap)
        else:
            since = -math.inf
            window = now - self._xid_last_eval + self.xid_overlap
        return min(max(window, 1.0), self.xid_max_lookback), since

    async def poll_once(self, now: float | None = None) -> list[Signal]:
        """Query the whole fleet once (every query evaluated at ``now``); return the signals.

        Never raises for telemetry trouble: an unreachable Prometheus yields STALE signals.
        """
        now = self._clock.now() if now is None else float(now)
        now = math.floor(now * 1000) / 1000  # Prometheus' resolution: no stamp after ``now``
        started = time.monotonic()
        requests_before = self._http_requests
        plan = self.plan
        errors: list[str] = []
        try:
            await self._in_thread(self._headers_refresh)
        except PermanentError as e:
            return self._unreachable(now, started, requests_before, str(e), len(errors))
        xid_window, xid_since = self._xid_window(now)
        exprs = [(self.freshness_query, "freshness query")]
        if plan.xid:
            exprs.append((xid_expr(xid_window, self.matchers), "XID query"))
        exprs.extend((q.expr, f"query of {', '.join(q.rules)}") for q in plan.metrics)
        results = await asyncio.gather(*(self.query(e, now, w) for e, w in exprs),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, HealerError):
                raise r
        fresh = results[0]
        if isinstance(fresh, BaseException):
            failed = sum(isinstance(r, BaseException) for r in results)
            return self._unreachable(now, started, requests_before, str(fresh), failed)
        if self.outage:
            log.info("prometheus reachable again", source=self.name, url=self.url,
                     down_for=round(now - (self.outage_since or now), 1))
            self.outage, self.outage_since = False, None

        rows, down, unmapped = self._fresh_rows(fresh)
        signals, transitions = self.freshness.observe(now, rows, down)
        self._log_transitions(transitions)
        stamp = self._heartbeats(rows)
        samples = len(fresh)
        failed = 0
        xid_events = 0
        stale_samples = 0
        rest = results[1:]
        if plan.xid:
            xid_result, rest = rest[0], rest[1:]
            if isinstance(xid_result, BaseException):
                failed += 1
                errors.append(self._once("XID query failed", str(xid_result),
                                         permanent=isinstance(xid_result, PermanentError)))
            else:
                series, bad = self._xid_series(xid_result)
                unmapped += bad
                samples += sum(len(s.samples) for s in series)
                events = self.xids.feed(series, since=xid_since)
                xid_events = len(events)
                signals.extend(self._xid_signals(events))
                self._xid_last_eval = now
        for q, res in zip(plan.metrics, rest, strict=True):
            if isinstance(res, BaseException):
                failed += 1
                errors.append(self._once("metric query failed", str(res),
                                         permanent=isinstance(res, PermanentError)))
                continue
            sigs, bad, n, old = self._metric_signals(q, res, stamp)
            signals.extend(sigs)
            unmapped += bad
            samples += n
            stale_samples += old
        if unmapped and "unmapped" not in self._logged:
            self._logged.add("unmapped")
            log.warning("samples without a node label were ignored", source=self.name,
                        host_labels=list(self.host_labels), count=unmapped)
        fresh_nodes = sum(1 for s in signals if s.kind is SignalKind.FRESH)
        stale_nodes = len({s.node for s in signals if s.kind is SignalKind.STALE})
        self._record(PollStats(now, time.monotonic() - started, len(exprs), failed,
                               self._http_requests - requests_before, samples, len(signals),
                               xid_events, fresh_nodes, stale_nodes, unmapped, stale_samples,
                               False, tuple(errors)))
        return signals

    def _unreachable(self, now: float, started: float, requests_before: int, error: str,
                     failed: int) -> list[Signal]:
        if not self.outage:
            log.warning("prometheus unreachable: telemetry of every node is stale (unknown)",
                        source=self.name, url=self.url, error=error,
                        nodes=len(self.freshness.inventory))
            self.outage, self.outage_since = True, now
        signals = self.freshness.unreachable(now, error)
        n = 1 + (1 if self.plan.xid else 0) + len(self.plan.metrics)
        self._record(PollStats(now, time.monotonic() - started, n, failed or n,
                               self._http_requests - requests_before, 0, len(signals), 0, 0,
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

    # -- backtests ------------------------------------------------------------------------

    async def history(self, start: float, end: float, step: float) -> list[Signal]:
        """The signals the source would have produced over ``[start, end]`` every ``step``.

        Metric rules and freshness use range queries; XIDs use the raw samples (in chunks of
        at most an hour), so every occurrence is found once. Nothing here touches the live
        poll state. Raises TransientError/PermanentError when Prometheus cannot answer.
        """
        if end <= start or step <= 0:
            raise ValueError("history needs start < end and a positive step")
        # Prometheus answers at most 11,000 points per series; and a day at most, because
        # timestamp() over a long range gets quadratically slower (a week: 9 s, a day: 0.2 s)
        span = min(step * 10_000, max(step, 86400.0))
        chunks: list[tuple[float, float]] = []
        a = start
        while a < end:
            b = min(a + span, end)
            chunks.append((a, b))
            a = b + step
        signals: list[Signal] = []
        # freshness first: it gives every metric sample its node's scrape time
        fresh_at: dict[float, list[FreshRow]] = defaultdict(list)
        down_at: dict[float, set[str]] = defaultdict(set)
        for a, b in chunks:
            for entry in await self.query_range(self.freshness_query, a, b, step):
                labels = entry.get("metric") or {}
                for t, v in _samples(entry):
                    if _UP_MARK in labels:
                        down_at[t].add(labels.get("instance", ""))
                        continue
                    node = self.node_of(labels)
                    if node is not None:
                        fresh_at[t].append(FreshRow(node, labels.get("instance", ""),
                                                    gpu_ref(labels), v))
        tracker = FreshnessTracker(self.name, stale_after=self.freshness.stale_after,
                                   forget_after=self.freshness.forget_after)
        for t in sorted(set(fresh_at) | set(down_at)):
            sigs, _ = tracker.observe(t, fresh_at.get(t, []), down_at.get(t, ()))
            signals.extend(sigs)
        for q in self.plan.metrics:
            for a, b in chunks:
                res = await self.query_range(q.expr, a, b, step)
                sigs, _, _, _ = self._metric_signals(q, res)
                signals.extend(sigs)
        if self.plan.xid:
            xids = XidTracker()
            a = start - self.xid_overlap  # one sample before start sets the baseline
            while a < end:
                b = min(a + 3600.0, end)
                res = await self.query(xid_expr(b - a, self.matchers), b)
                series, _ = self._xid_series(res)
                signals.extend(self._xid_signals(xids.feed(series, since=start)))
                a = b
        signals.sort(key=lambda s: (s.observed_at, s.node, s.kind.value))
        return signals


def _worse(op: Op, value: float, than: float) -> bool:
    return value < than if op in (Op.LT, Op.LE) else value > than


def _root_cause(e: BaseException) -> str:
    seen: set[int] = set()
    cur: BaseException | None = e
    last = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        last = cur
        cur = cur.__cause__ or cur.__context__
    text = str(last)
    return text if len(text) < 300 else text[:300] + "..."


def _map_status(e: _HttpStatus, what: str) -> HealerError:
    message = f"{what}: HTTP {e.status}: {e.body.strip()[:300]}"
    if e.status in (408, 429) or e.status >= 500:
        return TransientError(message, delay=e.retry_after)
    if e.status in (401, 403):
        return ForbiddenError(message)
    if e.status == 404:
        return NotFoundError(message)
    return PermanentError(message)
