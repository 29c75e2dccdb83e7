"""PromQL generation (pure): the fleet-wide queries of one poll and the rules they serve."""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from healer.core.model import TelemetrySourceName
from healer.core.rules import Aggregation, MetricRule, Op, PolicySet, XidRule
from healer.errors import ConfigError

SOURCE = TelemetrySourceName.DCGM.value
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
#: The series whose presence and sample time say that a GPU's telemetry is fresh.
DEFAULT_HEARTBEAT = "DCGM_FI_DEV_GPU_TEMP"
DEFAULT_HOST_LABELS = ("Hostname", "hostname")
#: Labels that identify a GPU on dcgm-exporter series (``uuid`` with --use-old-namespace;
#: ``DCGM_FI_DEV_SERIAL`` when the serial is exported as a label-type field).
GPU_LABELS = ("gpu", "UUID", "uuid", "DCGM_FI_DEV_SERIAL")
JOB_LABEL = "hpc_job"
UP_MARK = "healer_up"
#: The label that tells the rows of the per-node freshness query apart (``newest``/``gpus``).
FRESH_MARK = "healer_fresh"
#: The label that tells the parts of the recovery follow-up apart (the query's index).
TAG_LABEL = "healer_q"

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: The C-level comparison of each operator (a predicate test costs one call, no ``match``).
OP_FUNCS: dict[Op, Callable[[float, float], bool]] = {
    Op.GT: operator.gt, Op.GE: operator.ge, Op.LT: operator.lt, Op.LE: operator.le,
    Op.EQ: operator.eq, Op.NE: operator.ne,
}


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


def _matchers(matchers: Mapping[str, str] | None, regex: Mapping[str, str] | None
              ) -> list[str]:
    out: list[str] = []
    for op, given in (("=", matchers), ("=~", regex)):
        for k, v in (given or {}).items():
            if not _LABEL_NAME.match(k):
                raise ConfigError(f"{k!r} is not a Prometheus label name")
            out.append(f"{k}{op}{_quote(v)}")
    return out


def selector(metric: str, matchers: Mapping[str, str] | None = None,
             regex: Mapping[str, str] | None = None) -> str:
    """``metric{k="v",...,r=~"a|b"}`` with the values escaped (``regex``: ``=~`` matchers)."""
    if not _METRIC_NAME.match(metric):
        raise ConfigError(f"{metric!r} is not a Prometheus metric name")
    parts = _matchers(matchers, regex)
    return metric + "{" + ",".join(parts) + "}" if parts else metric


def alternation(values: Iterable[str]) -> str:
    """A regex (RE2, anchored by Prometheus) matching exactly these values: ``a|b\\.c``."""
    return "|".join(re.escape(v) for v in sorted(set(values)))


def host_regexes(hosts: Iterable[tuple[str, str]], limit: int = 4000
                 ) -> list[dict[str, str]]:
    """(label, value) pairs → ``=~`` matcher maps, one label each, each regex under ``limit``
    characters (a long host list is chunked: one query per map)."""
    by_label: dict[str, list[str]] = defaultdict(list)
    for label, value in sorted(set(hosts)):
        by_label[label].append(value)
    out: list[dict[str, str]] = []
    for label, values in by_label.items():
        chunk: list[str] = []
        size = 0
        for v in values:
            n = len(re.escape(v)) + 1
            if chunk and size + n > limit:
                out.append({label: alternation(chunk)})
                chunk, size = [], 0
            chunk.append(v)
            size += n
        if chunk:
            out.append({label: alternation(chunk)})
    return out


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
                matchers: Mapping[str, str] | None = None, join: str = "",
                regex: Mapping[str, str] | None = None) -> str:
    """The fleet-wide PromQL of one metric rule (a ``promql`` rule: its expression as given;
    ``regex`` restricts a generated one to some hosts, see :func:`host_regexes`)."""
    if rule.promql:
        return rule.promql.strip()
    if rule.series:  # ``by`` starts with the host labels (group_labels)
        return series_expr(rule, by[:by.index("instance")] if "instance" in by else by)
    sel = selector(rule.field, matchers, regex)
    match rule.aggregation:
        case Aggregation.VALUE:
            inner = sel
        case Aggregation.INCREASE:
            inner = f"increase({sel}[{duration(rule.window)}])"
        case Aggregation.RATE:
            inner = f"rate({sel}[{duration(rule.window)}])"
        case Aggregation.MAX_OVER_TIME:
            inner = f"max_over_time({sel}[{duration(rule.window)}])"
        case Aggregation.CHANGES:
            inner = f"changes({sel}[{duration(rule.window)}])"
    if join:
        inner = f"({inner}) {join.strip()}"
    agg = "min" if rule.op in (Op.LT, Op.LE) else "max"
    return f"{agg} by ({', '.join(by)}) ({inner})"


def series_expr(rule: MetricRule, host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> str:
    """The fleet-wide PromQL of a ``series`` rule (any exporter's metric): its own matchers
    (not the source's DCGM ones, nor its join), ``max by`` (``min by`` for ``<``/``<=``) the
    node label (``node_label``, else ``host_labels``) and the ``per`` labels: one series per
    node and part, e.g. ``max by (node, device, port) (changes(node_infiniband_state_id[10m]))``.
    """
    sel = selector(rule.field, dict(rule.matchers))
    if rule.aggregation is not Aggregation.VALUE:
        sel = f"{rule.aggregation.value}({sel}[{duration(rule.window)}])"
    by = group_labels((rule.node_label,) if rule.node_label else host_labels, rule.per)
    by = tuple(lb for lb in by if lb not in ("instance", *GPU_LABELS) or lb in rule.per
               or lb == rule.node_label)
    agg = "min" if rule.op in (Op.LT, Op.LE) else "max"
    return f"{agg} by ({', '.join(by)}) ({sel})"


def xid_expr(window: float, matchers: Mapping[str, str] | None = None,
             regex: Mapping[str, str] | None = None) -> str:
    """The raw samples of both XID series over ``window`` seconds (a range-vector query),
    of some hosts only with ``regex`` (see :func:`host_regexes`)."""
    parts = [f'__name__=~"{XID_GAUGE}|{XID_COUNT}"', *_matchers(matchers, regex)]
    return "{" + ",".join(parts) + "}" + f"[{duration(window)}]"


def xid_prequery_expr(window: float, *, by: Sequence[str],
                      matchers: Mapping[str, str] | None = None, first: bool = True) -> str:
    """The GPUs with an XID to report in ``window`` (an instant query, one row per GPU).

    ``first`` (the first poll after start, which reports the lookback and sets the
    baselines): every GPU whose last-XID gauge was non-zero or changed, with a count above 0,
    or with a count series with an ``xid`` label present in the window.

    Every later poll (``first=False``) lists only the GPUs with something *new* in the
    window: the gauge changed, a count series changed (rose, or was reset), or a series is
    new in the window (samples in ``[now-w, now]``, none in ``[now-2w, now-w]``: a gauge
    already non-zero at its first scrape, a count series that appeared), or a count series
    gone from it (its XID left the exporter's count window: the cursor must see it go, or
    the same XID coming back would not read as a rise). dcgm-exporter's
    gauge keeps its last non-zero code and its count series persist, so a GPU that once had
    an XID is not fetched again until something changes: the per-poll cost does not grow
    with uptime. The window overlaps the previous poll by more than a scrape interval, so a
    change (the sample and its predecessor) is seen by at least one poll.
    """
    w = duration(window)
    gauge = selector(XID_GAUGE, matchers)
    count = selector(XID_COUNT, matchers)
    named = XID_COUNT + "{" + ",".join([*_matchers(matchers, None), 'xid!=""']) + "}"
    if first:
        return (f"max by ({', '.join(by)}) (max_over_time({gauge}[{w}]) > 0 or "
                f"changes({gauge}[{w}]) > 0 or max_over_time({count}[{w}]) > 0 or "
                f"count_over_time({named}[{w}]))")
    return (f"max by ({', '.join(by)}) (changes({gauge}[{w}]) > 0 or "
            f"changes({named}[{w}]) > 0 or "
            f"(max_over_time({gauge}[{w}]) > 0 unless "
            f"count_over_time({gauge}[{w}] offset {w})) or "
            f"(count_over_time({named}[{w}]) unless "
            f"count_over_time({named}[{w}] offset {w})) or "
            f"(count_over_time({named}[{w}] offset {w}) unless "
            f"count_over_time({named}[{w}])))")


def server_filter(expr: str, predicates: Sequence[tuple[Op, float]]) -> str:
    """``(expr) > t`` with the loosest threshold, so Prometheus returns only violating series.

    ``>``/``>=`` predicates: the lowest threshold (``>=`` when tied); ``<``/``<=``: the
    highest; one ``==`` or ``!=`` predicate alone: itself (an InfiniBand port whose physical
    state ``!= 5``). No filter (``expr`` as is) for several ``==``/``!=`` or predicates of both
    directions.
    """
    if not predicates:
        return expr
    if len(predicates) == 1 and predicates[0][0] in (Op.EQ, Op.NE):
        op_eq, t_eq = predicates[0]
        return f"({expr}) {op_eq.value} {t_eq!r}"
    ops = {op for op, _ in predicates}
    if ops <= {Op.GT, Op.GE}:
        t = min(t for _, t in predicates)
        op = ">=" if (Op.GE, t) in predicates else ">"
    elif ops <= {Op.LT, Op.LE}:
        t = max(t for _, t in predicates)
        op = "<=" if (Op.LE, t) in predicates else "<"
    else:
        return expr
    return f"({expr}) {op} {t!r}"


def heartbeat_expr(sel: str) -> str:
    """The sample times of a heartbeat selector, of its finite samples only: a NaN or ±Inf
    reading (``+Inf`` °C) is not a sign of life (``and`` keeps ``timestamp()``'s sample
    times, which an operator applied to the selector itself would replace)."""
    return f"(timestamp({sel}) and ({sel} > -Inf < +Inf))"


def freshness_expr(*, by: Sequence[str], heartbeat: str = DEFAULT_HEARTBEAT,
                   matchers: Mapping[str, str] | None = None, join: str = "",
                   regex: Mapping[str, str] | None = None, up: bool = True) -> str:
    """Newest heartbeat sample time per GPU, plus every failing scrape target (``up == 0``).

    The per-GPU rows (UUID, serial and job labels): the follow-up of the nodes that need them
    (``regex`` restricts it to their hosts, ``up=False`` leaves the ``up`` part out)."""
    inner = heartbeat_expr(selector(heartbeat, matchers, regex))
    if join:
        inner = f"({inner}) {join.strip()}"
    out = f"max by ({', '.join(by)}) ({inner})"
    if not up:
        return out
    return f"{out} or {_up_down(matchers)}"


def _up_down(matchers: Mapping[str, str] | None) -> str:
    return f'label_replace({selector("up", matchers)} == 0, "{UP_MARK}", "0", "", "")'


def node_freshness_expr(*, by_node: Sequence[str], by_gpu: Sequence[str],
                        stale_after: float, heartbeat: str = DEFAULT_HEARTBEAT,
                        matchers: Mapping[str, str] | None = None, join: str = "") -> str:
    """A live poll's freshness query: two rows per node, whatever its number of GPUs.

    ``FRESH_MARK="newest"``: the newest heartbeat sample time of the node (``by_node``:
    host labels, ``instance``, extras); ``FRESH_MARK="gpus"``: how many distinct GPUs
    (``by_gpu`` groups) have a heartbeat at most ``stale_after`` old (no row when none has);
    plus every failing scrape target (``up == 0``) as in :func:`freshness_expr`.
    """
    inner = heartbeat_expr(selector(heartbeat, matchers))
    if join:
        inner = f"({inner}) {join.strip()}"
    node = ", ".join(by_node)
    newest = f"max by ({node}) ({inner})"
    gpus = (f"count by ({node}) (max by ({', '.join(by_gpu)}) ({inner}) "
            f">= time() - {float(stale_after)!r})")
    return (f'label_replace({newest}, "{FRESH_MARK}", "newest", "", "") or '
            f'label_replace({gpus}, "{FRESH_MARK}", "gpus", "", "") or {_up_down(matchers)}')


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One metric query of a poll, the rules it serves and their predicates.

    ``predicates`` holds every distinct (op, threshold) of those rules: a sample *violates*
    when at least one of them holds (rules sharing one expression may differ in threshold or
    even in operator). A query without predicates (built by hand) violates for every value.
    """

    key: str  # the Signal key (MetricRule.key)
    expr: str  # what a live poll sends: ``base`` with the server-side filter
    op: Op  # the first rule's operator: which of duplicate series is the worst
    rules: tuple[str, ...]  # "policy/rule"
    predicates: tuple[tuple[Op, float], ...] = ()
    base: str = ""  # the unfiltered expression (backtests, recoveries); "" = ``expr``
    rule: MetricRule | None = field(default=None, compare=False)  # to restrict to hosts

    @property
    def unfiltered(self) -> str:
        return self.base or self.expr

    def violates(self, value: float) -> bool:
        """Whether ``value`` satisfies at least one predicate (NaN/±Inf never do)."""
        if not -_INF < value < _INF:
            return False
        if not self.predicates:
            return True
        return any(OP_FUNCS[op](value, threshold) for op, threshold in self.predicates)

    def tests(self) -> tuple[tuple[Callable[[float, float], bool], float], ...]:
        """The predicates as (comparison, threshold) pairs, for a tight loop."""
        return tuple((OP_FUNCS[op], t) for op, t in self.predicates)


_INF = float("inf")


@dataclass(frozen=True, slots=True)
class QueryPlan:
    metrics: tuple[PlannedQuery, ...]
    xid: bool  # the policy set has XID rules
    conflicts: tuple[str, ...] = ()  # keys served by more than one expression

    @property
    def queries_per_poll(self) -> int:
        """Queries of a poll's first round: the metric queries, the XID pre-query, freshness
        (follow-ups, when needed, come on top: see ``PollStats.queries``)."""
        return len(self.metrics) + (1 if self.xid else 0) + 1


def plan_queries(policies: PolicySet, *, by: Sequence[str],
                 matchers: Mapping[str, str] | None = None, join: str = "") -> QueryPlan:
    """One query per distinct metric expression of every policy, one XID query if needed.

    Each query's ``expr`` carries the server-side filter of its predicates
    (:func:`server_filter`); ``base`` is the unfiltered expression.
    """
    exprs: dict[str, tuple[str, Op, list[str], list[tuple[Op, float]], MetricRule]] = {}
    keys: dict[str, set[str]] = defaultdict(set)
    xid = False
    for policy in policies.policies:
        for rule in policy.rules:
            if isinstance(rule, XidRule):
                xid = True
            elif isinstance(rule, MetricRule):
                expr = metric_expr(rule, by=by, matchers=matchers, join=join)
                entry = exprs.setdefault(expr, (rule.key, rule.op, [], [], rule))
                entry[2].append(f"{policy.name}/{rule.name}")
                pred = (rule.op, float(rule.threshold))
                if pred not in entry[3]:
                    entry[3].append(pred)
                keys[rule.key].add(expr)
    metrics = tuple(PlannedQuery(key, server_filter(expr, preds), op, tuple(rules),
                                 tuple(preds), expr, first)
                    for expr, (key, op, rules, preds, first) in exprs.items())
    conflicts = tuple(sorted(k for k, e in keys.items() if len(e) > 1))
    return QueryPlan(metrics, xid, conflicts)
