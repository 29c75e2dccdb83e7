"""PromQL generation (pure): the fleet-wide queries of one poll and the rules they serve."""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from healer.core.policy import Aggregation, MetricRule, Op, PolicySet, XidRule
from healer.errors import ConfigError

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
UP_MARK = "healer_up"

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
            f'label_replace({up} == 0, "{UP_MARK}", "0", "", "")')


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One metric query of a poll, the rules it serves and their predicates.

    ``predicates`` holds every distinct (op, threshold) of those rules: a sample *violates*
    when at least one of them holds (rules sharing one expression may differ in threshold or
    even in operator). A query without predicates (built by hand) violates for every value.
    """

    key: str  # the Signal key (MetricRule.key)
    expr: str
    op: Op  # the first rule's operator: which of duplicate series is the worst
    rules: tuple[str, ...]  # "policy/rule"
    predicates: tuple[tuple[Op, float], ...] = ()

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
        """HTTP queries one poll sends: the metric queries, the XID query, freshness."""
        return len(self.metrics) + (1 if self.xid else 0) + 1


def plan_queries(policies: PolicySet, *, by: Sequence[str],
                 matchers: Mapping[str, str] | None = None, join: str = "") -> QueryPlan:
    """One query per distinct metric expression of every policy, one XID query if needed."""
    exprs: dict[str, tuple[str, Op, list[str], list[tuple[Op, float]]]] = {}
    keys: dict[str, set[str]] = defaultdict(set)
    xid = False
    for policy in policies.policies:
        for rule in policy.rules:
            if isinstance(rule, XidRule):
                xid = True
            elif isinstance(rule, MetricRule):
                expr = metric_expr(rule, by=by, matchers=matchers, join=join)
                entry = exprs.setdefault(expr, (rule.key, rule.op, [], []))
                entry[2].append(f"{policy.name}/{rule.name}")
                pred = (rule.op, float(rule.threshold))
                if pred not in entry[3]:
                    entry[3].append(pred)
                keys[rule.key].add(expr)
    metrics = tuple(PlannedQuery(key, expr, op, tuple(rules), tuple(preds))
                    for expr, (key, op, rules, preds) in exprs.items())
    conflicts = tuple(sorted(k for k, e in keys.items() if len(e) > 1))
    return QueryPlan(metrics, xid, conflicts)
