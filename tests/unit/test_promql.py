"""PromQL generation, label normalisation and the XID/freshness trackers of the Prometheus source.

No Prometheus here: the trackers get the sample lists an API answer would hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.freshness import FreshnessTracker, FreshRow
from healer.adapters.prometheus.labels import gpu_ref, node_name
from healer.adapters.prometheus.promql import (
    TAG_LABEL,
    XID_COUNT,
    XID_GAUGE,
    duration,
    freshness_expr,
    group_labels,
    metric_expr,
    plan_queries,
    selector,
    xid_expr,
    xid_prequery_expr,
)
from healer.adapters.prometheus.xid import XidEvent, XidSeries, XidTracker
from healer.core.model import GpuRef, Severity, Signal, SignalKind
from healer.core.rules import Aggregation, MetricRule, Op, Policy, PolicySet, XidRule
from healer.core.rules import LabelSelector as Sel
from healer.errors import ConfigError
from healer.policy.load import load_policy_set

ROOT = Path(__file__).resolve().parents[2]
BY = group_labels()
G0 = GpuRef(0, "GPU-a")
G1 = GpuRef(1, "GPU-b")


def rule(field: str = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", agg: Aggregation = Aggregation.VALUE,
         window: float = 600.0, op: Op = Op.GT, promql: str = "", name: str = "r") -> MetricRule:
    return MetricRule(name, Severity.FAILED, field, op, 0.0, 0.0, agg, window, promql)


def policies(*rules: MetricRule | XidRule) -> PolicySet:
    return PolicySet((Policy("p", Sel(), tuple(rules)),))


# ---------------------------------------------------------------------------------------------
# PromQL


@pytest.mark.parametrize(("seconds", "text"), [
    (600, "10m"), (3600, "1h"), (86400, "1d"), (90, "90s"), (1, "1s"), (1.5, "1500ms"),
    (7200, "2h"), (61, "61s"),
])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_duration_rejects_zero() -> None:
    with pytest.raises(ValueError, match="positive"):
        duration(0)


def test_selector_escapes_values_and_checks_names() -> None:
    assert selector("up") == "up"
    assert selector("up", {"job": 'a"b\\c'}) == 'up{job="a\\"b\\\\c"}'
    with pytest.raises(ConfigError):
        selector("not a metric")
    with pytest.raises(ConfigError):
        selector("up", {"bad-label": "x"})


def test_group_labels_cover_both_host_spellings_and_the_gpu() -> None:
    assert BY == ("Hostname", "hostname", "instance", "gpu", "UUID", "uuid",
                  "DCGM_FI_DEV_SERIAL")
    assert group_labels(("node",), ("cluster",), jobs=True) == (
        "node", "instance", "gpu", "UUID", "uuid", "DCGM_FI_DEV_SERIAL", "hpc_job", "cluster")
    with pytest.raises(ConfigError):
        group_labels(("no-dashes",))


@pytest.mark.parametrize(("agg", "inner"), [
    (Aggregation.VALUE, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    (Aggregation.INCREASE, "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])"),
    (Aggregation.RATE, "rate(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])"),
    (Aggregation.MAX_OVER_TIME, "max_over_time(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])"),
])
def test_metric_expr_per_aggregation(agg: Aggregation, inner: str) -> None:
    by = "Hostname, hostname, instance, gpu, UUID, uuid, DCGM_FI_DEV_SERIAL"
    assert metric_expr(rule(agg=agg), by=BY) == f"max by ({by}) ({inner})"


def test_metric_expr_min_for_lower_bounds_matchers_and_join() -> None:
    e = metric_expr(rule("DCGM_FI_DEV_GPU_TEMP", op=Op.LT), by=("hostname", "gpu"),
                    matchers={"job": "dcgm"})
    assert e == 'min by (hostname, gpu) (DCGM_FI_DEV_GPU_TEMP{job="dcgm"})'
    e = metric_expr(rule(agg=Aggregation.INCREASE, window=3600), by=("node", "gpu"),
                    join="* on(namespace, pod) group_left(node) kube_pod_info")
    assert e == ("max by (node, gpu) ((increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1h])) "
                 "* on(namespace, pod) group_left(node) kube_pod_info)")


def test_promql_rule_runs_as_given() -> None:
    expr = ' sum by (Hostname) (DCGM_FI_DEV_GPU_TEMP > 90) '
    assert metric_expr(rule(promql=expr), by=BY, matchers={"job": "x"}) == expr.strip()


def test_xid_and_freshness_queries() -> None:
    assert xid_expr(45) == f'{{__name__=~"{XID_GAUGE}|{XID_COUNT}"}}[45s]'
    assert xid_expr(600, {"job": "dcgm"}) == (
        f'{{__name__=~"{XID_GAUGE}|{XID_COUNT}",job="dcgm"}}[10m]')
    f = freshness_expr(by=("hostname", "gpu"), matchers={"job": "dcgm"})
    hb = 'DCGM_FI_DEV_GPU_TEMP{job="dcgm"}'
    assert f == (f'max by (hostname, gpu) ((timestamp({hb}) and ({hb} > -Inf < +Inf))) or '
                 'label_replace(up{job="dcgm"} == 0, "healer_up", "0", "", "")')


def test_plan_from_the_default_policies_is_one_query_per_rule() -> None:
    ps = load_policy_set([ROOT / "policies" / "default.yaml"])
    plan = plan_queries(ps, by=BY)
    metric_rules = {r.name for p in ps.policies for r in p.rules if isinstance(r, MetricRule)}
    assert len(plan.metrics) == len(metric_rules) == 8
    assert plan.xid
    assert plan.queries_per_poll == 10
    assert not plan.conflicts
    for q in plan.metrics:  # fleet-wide: no query names a node
        assert "Hostname=" not in q.expr
        assert "hostname=" not in q.expr
    keys = {q.key for q in plan.metrics}
    assert "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[600s])" in keys
    assert "DCGM_FI_DEV_GPU_TEMP" in keys


def test_plan_deduplicates_identical_rules_and_keeps_aggregations_apart() -> None:
    a = rule(agg=Aggregation.INCREASE, name="a")
    b = rule(agg=Aggregation.INCREASE, name="b")
    c = rule(agg=Aggregation.VALUE, name="c")
    p = promql = rule(promql="vector(1)", name="raw")
    plan = plan_queries(policies(a, b, p), by=BY)
    assert len(plan.metrics) == 2
    assert plan.metrics[0].rules == ("p/a", "p/b")
    assert {q.key for q in plan.metrics} == {a.key, promql.key}
    assert not plan.xid
    assert plan.queries_per_poll == 3
    # the key carries the aggregation and window, so a gauge rule and an increase rule on the
    # same field never mix their samples
    both = plan_queries(policies(a, c), by=BY)
    assert not both.conflicts
    assert {q.key for q in both.metrics} == {a.key, c.key}


# ---------------------------------------------------------------------------------------------
# Labels


@pytest.mark.parametrize(("labels", "node"), [
    ({"Hostname": "gpu-1", "gpu": "0"}, "gpu-1"),
    ({"hostname": "gpu-2"}, "gpu-2"),
    ({"Hostname": "a", "hostname": "b"}, "a"),
    ({"Hostname": "", "hostname": "b"}, "b"),
    ({"Hostname": " gpu-3 "}, "gpu-3"),
    ({"instance": "10.0.0.1:9400"}, None),
])
def test_node_name_normalises_both_spellings(labels: dict[str, str], node: str | None) -> None:
    assert node_name(labels) == node


def test_node_name_with_other_host_labels() -> None:
    assert node_name({"node": "n1", "Hostname": "pod-x"}, ("node", "Hostname")) == "n1"


@pytest.mark.parametrize(("labels", "ref"), [
    ({"gpu": "3", "UUID": "GPU-x"}, GpuRef(3, "GPU-x")),
    ({"gpu": "3", "uuid": "GPU-x"}, GpuRef(3, "GPU-x")),
    ({"gpu": "1", "UUID": "GPU-y", "DCGM_FI_DEV_SERIAL": "1650"}, GpuRef(1, "GPU-y", "1650")),
    ({"UUID": "GPU-z"}, GpuRef(-1, "GPU-z")),
    ({"gpu": "x", "UUID": "GPU-z"}, GpuRef(-1, "GPU-z")),
    ({"Hostname": "n"}, None),
])
def test_gpu_ref(labels: dict[str, str], ref: GpuRef | None) -> None:
    assert gpu_ref(labels) == ref


def test_source_node_map_and_queries_without_a_connection() -> None:
    ps = policies(rule(agg=Aggregation.INCREASE), XidRule("x", Severity.FAILED, frozenset({79})))

    def by_ip(labels: dict[str, str]) -> str | None:
        return {"10.0.0.1:9400": "gpu-7"}.get(labels.get("instance", ""))

    src = PrometheusSource("http://127.0.0.1:1/", ps, node_map=by_ip, matchers={"job": "dcgm"})
    try:
        assert src.url == "http://127.0.0.1:1"
        assert src.node_of({"instance": "10.0.0.1:9400", "Hostname": "pod"}) == "gpu-7"
        assert src.node_of({"instance": "other", "hostname": "gpu-1"}) == "gpu-1"
        assert src.node_of({"instance": "other"}) is None
        assert src.plan.queries_per_poll == 3
        assert 'job="dcgm"' in src.plan.metrics[0].expr
        assert 'up{job="dcgm"} == 0' in src.freshness_query
        # per node, not per GPU: the job labels come with the per-GPU follow-up rows
        assert "healer_fresh" in src.freshness_query
        assert "hpc_job" not in src.freshness_query
        assert "hpc_job" not in src.plan.metrics[0].expr
    finally:
        src.close()


def test_source_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError):
        PrometheusSource("http://x", policies(), poll_interval=0)
    with pytest.raises(ConfigError):
        PrometheusSource("http://x", policies(), host_labels=("bad label",))


# ---------------------------------------------------------------------------------------------
# XIDs


def gauge(*points: tuple[float, float], gpu: GpuRef = G0, node: str = "n") -> XidSeries:
    return XidSeries(node, gpu, XID_GAUGE, None, tuple(points))


def count(xid: int | None, *points: tuple[float, float], gpu: GpuRef = G0) -> XidSeries:
    return XidSeries("n", gpu, XID_COUNT, xid, tuple(points))


def codes(events: list[XidEvent]) -> list[tuple[float, int, str]]:
    return [(e.at, e.code, e.via) for e in events]


def test_first_sample_is_a_baseline_then_changes_are_reported_once() -> None:
    t = XidTracker()
    assert t.feed([gauge((1, 79), (2, 79))]) == []  # old XID: not reported
    assert codes(t.feed([gauge((2, 79), (3, 0), (4, 48))])) == [(4, 48, "last-value")]
    assert t.feed([gauge((4, 48), (5, 48), (6, 48))]) == []  # same last value: once only
    assert codes(t.feed([gauge((7, 79))])) == [(7, 79, "last-value")]


def test_last_value_switching_series_err_code_is_one_timeline() -> None:
    t = XidTracker()
    # dcgm-exporter's err_code label makes a new series when the code changes
    old = gauge((1, 0), (2, 0))
    new = gauge((3, 79), (4, 79))
    assert codes(t.feed([old, new])) == [(3, 79, "last-value")]


def test_count_series_reports_every_occurrence_including_repeats() -> None:
    t = XidTracker()
    t.feed([count(None, (1, 0)), gauge((1, 0))])
    ev = t.feed([count(79, (2, 3)), gauge((2, 79))])
    assert codes(ev) == [(2, 79, "count")] * 3  # count wins over the single last-value change
    ev = t.feed([count(79, (2, 3), (3, 3), (4, 4)), gauge((3, 79), (4, 79))])
    assert codes(ev) == [(4, 79, "count")]  # an identical XID again: only the count shows it
    # occurrences leave the window, then a new one arrives
    ev = t.feed([count(None, (5, 0)), count(79, (6, 1)), gauge((5, 79), (6, 79))])
    assert codes(ev) == [(6, 79, "count")]


def test_two_codes_in_one_scrape_and_duplicate_job_series() -> None:
    t = XidTracker()
    t.feed([count(None, (1, 0))])
    ev = t.feed([count(13, (2, 2)), count(79, (2, 1)), count(79, (2, 1)), gauge((2, 79))])
    assert codes(ev) == [(2, 13, "count"), (2, 13, "count"), (2, 79, "count")]


def test_gpus_are_tracked_separately_and_since_suppresses_old_events() -> None:
    t = XidTracker()
    ev = t.feed([gauge((1, 0), (5, 79)), gauge((1, 0), (2, 48), gpu=G1)], since=3)
    assert [(e.gpu, e.code) for e in ev] == [(G0, 79)]
    t.forget("n")
    assert t.feed([gauge((6, 79))]) == []  # forgotten: baseline again


# ---------------------------------------------------------------------------------------------
# Freshness


def row(node: str, ts: float, gpu: GpuRef | None = G0, inst: str = "i1") -> FreshRow:
    return FreshRow(node, inst, gpu, ts)


def kinds(signals: list[Signal]) -> list[tuple[str, str, str, GpuRef | None]]:
    return [(s.node, s.kind.value, s.get("reason"), s.gpu) for s in signals]


def test_fresh_old_missing_and_down() -> None:
    f = FreshnessTracker(stale_after=3)
    sigs, tr = f.observe(100, [row("a", 99.5), row("a", 99.5, G1), row("b", 99, inst="i2")])
    assert kinds(sigs) == [("a", "fresh", "", None), ("b", "fresh", "", None)]
    assert tr == []  # the first sight of a fresh node is not a transition
    # a's GPU 1 vanished, b's exporter is down (up == 0 for its instance)
    sigs, tr = f.observe(101, [row("a", 100.5)], down_instances={"i2"})
    assert kinds(sigs) == [("a", "stale", "gpu-missing", G1), ("b", "stale", "exporter-down", None)]
    assert [(t.node, t.stale, t.reason) for t in tr] == [("a", True, "gpu-missing"),
                                                          ("b", True, "exporter-down")]
    # b absent although its target is up; a's data is old (no scrape since)
    sigs, _ = f.observe(110, [row("a", 100.5), row("a", 100.5, G1)])
    assert kinds(sigs) == [("a", "stale", "series-old", None),
                           ("b", "stale", "series-missing", None)]
    assert sigs[0].get("age") == "9.5"
    sigs, tr = f.observe(111, [row("a", 110.5), row("a", 110.5, G1), row("b", 110.5)])
    assert kinds(sigs) == [("a", "fresh", "", None), ("b", "fresh", "", None)]
    assert [(t.node, t.stale) for t in tr] == [("a", False), ("b", False)]
    assert all(s.observed_at == 111 and s.key == "dcgm" for s in sigs)


def test_unreachable_marks_every_known_node_and_keeps_their_state() -> None:
    f = FreshnessTracker(stale_after=3)
    f.observe(100, [row("a", 99.5), row("b", 99.5)])
    sigs = f.unreachable(101, "connection refused")
    assert [(s.node, s.kind, s.get("reason")) for s in sigs] == [
        ("a", SignalKind.STALE, "prometheus-unreachable"),
        ("b", SignalKind.STALE, "prometheus-unreachable")]
    _, tr = f.observe(102, [row("a", 101.5), row("b", 101.5)])
    assert tr == []  # nothing changed per node: no per-node log storm on recovery


def test_replaced_gpu_and_forgetting() -> None:
    f = FreshnessTracker(stale_after=3, forget_after=50)
    f.observe(100, [row("a", 100), row("b", 100, inst="i2")])
    new = GpuRef(0, "GPU-new")
    sigs, _ = f.observe(101, [row("a", 101, new), row("b", 101, inst="i2")])
    assert kinds(sigs)[0] == ("a", "fresh", "", None)  # same index, other UUID: replaced
    f.observe(140, [row("a", 140, new)])
    sigs, _ = f.observe(160, [row("a", 160, new)])
    assert f.nodes == ["a"]  # b not seen for more than forget_after
    assert kinds(sigs) == [("a", "fresh", "", None)]


def test_node_level_series_without_gpu() -> None:
    f = FreshnessTracker(stale_after=3)
    sigs, _ = f.observe(10, [row("a", 9.9, gpu=None)])
    assert kinds(sigs) == [("a", "fresh", "", None)]


# ---------------------------------------------------------------------------------------------
# Parsing a poll (PrometheusSource.parse_poll): only violating series and one recovery

T = 1_700_000_000.0
TEMP = "DCGM_FI_DEV_GPU_TEMP"


def body(result: list[Any], kind: str = "vector") -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": kind, "result": result}}).encode()


def labels(node: str, gpu: int) -> dict[str, str]:
    return {"Hostname": node, "instance": f"{node}:9400", "gpu": str(gpu),
            "UUID": f"GPU-{node}-{gpu}"}


def ref(node: str, gpu: int) -> GpuRef:
    return GpuRef(gpu, f"GPU-{node}-{gpu}")


def heartbeat(now: float, *gpus: tuple[str, int]) -> bytes:
    return body([{"metric": labels(n, g), "value": [now, str(now - 1)]} for n, g in gpus])


def values(now: float, vals: dict[tuple[str, int], Any]) -> bytes:
    return body([{"metric": labels(n, g), "value": [now, v]} for (n, g), v in vals.items()])


def temp_rule(op: Op = Op.GE, threshold: float = 90.0, name: str = "hot",
              promql: str = "") -> MetricRule:
    return MetricRule(name, Severity.DEGRADING, TEMP, op, threshold, promql=promql)


def tagged(src: PrometheusSource, now: float, vals: dict[tuple[str, int], Any],
           bodies: dict[str, bytes]) -> bytes:
    """The recovery follow-up's answer: every query's values, tagged with its index."""
    out: list[Any] = []
    for i, q in enumerate(src.plan.metrics):
        raw = bodies.get(q.key)
        entries = (json.loads(raw)["data"]["result"] if raw is not None else
                   [{"metric": labels(n, g), "value": [now, v]} for (n, g), v in vals.items()])
        out.extend({"metric": {**e["metric"], TAG_LABEL: str(i)}, "value": e["value"]}
                   for e in entries)
    return body(out)


class Poller:
    """A source fed raw bodies through parse_poll, one poll per call, 15 s apart."""

    def __init__(self, *rules: MetricRule | XidRule) -> None:
        self.src = PrometheusSource("http://127.0.0.1:1", policies(*rules), stale_after=60)
        self.now = T

    def poll(self, metric: dict[tuple[str, int], Any] | None = None,
             gpus: tuple[tuple[str, int], ...] = (("a", 0), ("a", 1)),
             **bodies: bytes) -> list[Signal]:
        self.now += 15
        exprs = self.src.poll_queries(self.now)
        answers: dict[str, bytes] = {exprs[0]: bodies.get("fresh", heartbeat(self.now, *gpus))}
        if self.src.plan.xid:
            answers[exprs[1]] = bodies.get("xid", body([], "matrix"))
        for q in self.src.plan.metrics:
            answers[q.expr] = bodies.get(q.key, values(self.now, metric or {}))
        signals = self.src.parse_poll(self.now, answers)
        # the follow-up round (host-restricted queries, not emulated here): the raw XID
        # samples get the ``xid`` body (which also answered the pre-query: it lists the
        # GPUs); the recovery query gets the metric values, tagged as Prometheus would
        follow = self.src.follow_up_queries(self.now)
        if follow:
            more: dict[str, bytes] = {}
            for e in follow:
                if XID_GAUGE in e:
                    more[e] = bodies.get("xid", body([], "matrix"))
                else:
                    more[e] = tagged(self.src, self.now, metric or {}, bodies)
            signals += self.src.parse_poll(self.now, more)
        return signals

    def metrics(self, signals: list[Signal]) -> list[tuple[GpuRef | None, float]]:
        return [(s.gpu, s.value) for s in signals if s.kind is SignalKind.METRIC]

    def close(self) -> None:
        self.src.close()


@pytest.fixture
def poller() -> Any:
    made: list[Poller] = []

    def make(*rules: MetricRule | XidRule) -> Poller:
        made.append(Poller(*rules))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_plan_keeps_every_distinct_predicate_of_one_expression() -> None:
    expr = "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP)"
    plan = plan_queries(policies(temp_rule(Op.GT, 90, "a", expr), temp_rule(Op.LT, 10, "b", expr),
                                 temp_rule(Op.GT, 90, "c", expr)), by=BY)
    (q,) = plan.metrics
    assert q.predicates == ((Op.GT, 90.0), (Op.LT, 10.0))
    assert q.violates(95)
    assert q.violates(5)
    assert not q.violates(50)
    assert not q.violates(float("inf"))
    assert not q.violates(float("nan"))
    default = plan_queries(load_policy_set([ROOT / "policies" / "default.yaml"]), by=BY)
    assert all(q.predicates for q in default.metrics)


def test_violating_every_poll_healthy_never_recovery_once(poller: Any) -> None:
    p = poller(temp_rule())
    a0, a1 = ref("a", 0), ref("a", 1)
    assert p.metrics(p.poll({("a", 0): "50", ("a", 1): "40"})) == []  # healthy: never
    assert p.metrics(p.poll({("a", 0): "95", ("a", 1): "40"})) == [(a0, 95)]
    sigs = p.poll({("a", 0): "96", ("a", 1): "41"})
    assert p.metrics(sigs) == [(a0, 96)]  # every poll while violating
    (hot,) = [s for s in sigs if s.kind is SignalKind.METRIC]
    assert hot.observed_at == p.now - 1  # stamped with the scrape time
    assert hot.get("rule") == "p/hot"
    assert p.metrics(p.poll({("a", 0): "50", ("a", 1): "40"})) == [(a0, 50)]  # recovery
    assert p.metrics(p.poll({("a", 0): "50", ("a", 1): "40"})) == []  # then nothing
    assert p.metrics(p.poll({("a", 0): "40", ("a", 1): "90"})) == [(a1, 90)]  # >= 90
    assert p.src.last_poll is not None
    assert p.src.last_poll.samples == 2 + 2  # heartbeats + metric samples


def test_recovery_after_a_missing_or_stale_poll_and_forgotten_nodes(poller: Any) -> None:
    p = poller(temp_rule())
    a0 = ref("a", 0)
    assert p.metrics(p.poll({("a", 0): "95"})) == [(a0, 95)]
    assert p.metrics(p.poll({})) == []  # the series is absent: nothing, still violating
    # no heartbeat for GPU 0 now: dropped as stale (the STALE signal says why)
    sigs = p.poll({("a", 0): "50"}, gpus=(("a", 1),))
    assert p.metrics(sigs) == []
    assert any(s.kind is SignalKind.STALE and s.gpu == a0 for s in sigs)
    assert p.metrics(p.poll({("a", 0): "50"})) == [(a0, 50)]  # the recovery, when seen
    assert p.metrics(p.poll({("a", 0): "50"})) == []
    assert p.metrics(p.poll({("a", 0): "99"})) == [(a0, 99)]
    p.src.parser.forget("a")
    assert p.metrics(p.poll({("a", 0): "50"})) == []  # forgotten: no recovery owed


def test_duplicate_series_the_worst_and_a_violating_one_wins(poller: Any) -> None:
    p = poller(temp_rule())
    a0 = ref("a", 0)
    dup = body([{"metric": {**labels("a", 0), "hpc_job": j}, "value": [p.now + 15, v]}
                for j, v in (("1", "40"), ("2", "95"), ("3", "92"))])
    assert p.metrics(p.poll(**{TEMP: dup})) == [(a0, 95)]
    dup = body([{"metric": {**labels("a", 0), "hpc_job": j}, "value": [p.now + 15, v]}
                for j, v in (("1", "40"), ("2", "45"))])
    assert p.metrics(p.poll(**{TEMP: dup})) == [(a0, 45)]  # one recovery: the worst


def test_mixed_ops_on_one_expression(poller: Any) -> None:
    expr = "max by (Hostname, instance, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP)"
    p = poller(temp_rule(Op.GT, 90, "hot", expr), temp_rule(Op.LT, 10, "cold", expr))
    a0 = ref("a", 0)
    key = "rule:hot"
    assert p.metrics(p.poll(**{key: values(p.now + 15, {("a", 0): "50"})})) == []
    assert p.metrics(p.poll(**{key: values(p.now + 15, {("a", 0): "5"})})) == [(a0, 5)]
    assert p.metrics(p.poll(**{key: values(p.now + 15, {("a", 0): "95"})})) == [(a0, 95)]
    assert p.metrics(p.poll(**{key: values(p.now + 15, {("a", 0): "50"})})) == [(a0, 50)]
    assert p.metrics(p.poll(**{key: values(p.now + 15, {("a", 0): "50"})})) == []


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "Inf"])
def test_nan_and_inf_are_not_readings(poller: Any, bad: str) -> None:
    p = poller(temp_rule(Op.NE, 0), temp_rule(Op.LT, 90, "cool", promql="x"))
    a0 = ref("a", 0)
    assert p.metrics(p.poll({("a", 0): bad})) == []  # never a violation (NaN != 0 is True)
    assert p.src.last_poll is not None
    assert p.src.last_poll.malformed_samples == 2
    assert p.metrics(p.poll({("a", 0): "3"})) == [(a0, 3)] * 2
    assert p.metrics(p.poll({("a", 0): bad})) == []  # nor a recovery
    assert p.metrics(p.poll({("a", 0): "0"})) == [(a0, 0)] * 2  # the real one is


def test_inf_heartbeat_is_skipped(poller: Any) -> None:
    p = poller(temp_rule())
    fresh = body([{"metric": labels("a", 0), "value": [p.now + 15, v]}
                  for v in ("+Inf", "NaN")] +
                 [{"metric": labels("b", 0), "value": [p.now + 15, str(p.now + 14)]}])
    sigs = p.poll({("a", 0): "95", ("b", 0): "95"}, fresh=fresh)
    assert [(s.node, s.kind) for s in sigs if s.kind is not SignalKind.METRIC] == [
        ("b", SignalKind.FRESH)]
    assert p.metrics(sigs) == [(ref("b", 0), 95)]  # a has no (finite) heartbeat: dropped
    assert p.src.last_poll is not None
    assert p.src.last_poll.malformed_samples == 2


def test_malformed_entries_are_skipped_and_counted(poller: Any) -> None:
    p = poller(temp_rule(), XidRule("x", Severity.FAILED, frozenset({79})))
    now = p.now + 15
    junk: list[Any] = [[], "x", 3, None, {"metric": [], "value": [now, "95"]},
                       {"metric": labels("a", 0)}, {"metric": labels("a", 0), "value": "95"},
                       {"metric": labels("a", 0), "value": [now]},
                       {"metric": labels("a", 0), "value": [now, None]},
                       {"metric": labels("a", 0), "value": [now, ["95"]]},
                       {"metric": {"Hostname": ["a"], "gpu": {}}, "value": [now, "95"]},
                       {"metric": labels("a", 0), "values": 5},
                       {"metric": labels("a", 0), "values": [[now, "+Inf"], ["x"], 7]}]
    good_fresh = [{"metric": labels("a", 0), "value": [now, str(now - 1)]}]
    good_temp = [{"metric": labels("a", 0), "value": [now, "95"]}]
    sigs = p.poll(fresh=body(junk + good_fresh), xid=body(junk, "matrix"),
                  **{TEMP: body(junk + good_temp)})
    assert p.metrics(sigs) == [(ref("a", 0), 95)]
    assert [s.node for s in sigs if s.kind is SignalKind.FRESH] == ["a"]
    assert p.src.last_poll is not None
    assert p.src.last_poll.malformed_samples > 0
    assert p.src.last_poll.failed_queries == 0
    # an answer that is not JSON, or not shaped like one, is a failed query
    sigs = p.poll(**{TEMP: b"<html>proxy</html>"})
    assert p.src.last_poll.failed_queries == 1
    sigs = p.poll(xid=b'{"status": "success", "data": []}')
    assert p.src.last_poll.failed_queries == 1
    sigs = p.poll(fresh=b"[1, 2]")
    assert p.src.last_poll.outage
    assert all(s.kind is SignalKind.STALE for s in sigs)


def xid_body(now: float, *points: tuple[float, str]) -> bytes:
    lb = {**labels("a", 0), "__name__": XID_GAUGE}
    return body([{"metric": lb, "values": [[t, v] for t, v in points]}], "matrix")


def test_inf_xid_sample_does_not_block_the_cursor(poller: Any) -> None:
    p = poller(XidRule("x", Severity.FAILED, frozenset({79})))

    def xids(signals: list[Signal]) -> list[float]:
        return [s.value for s in signals if s.kind is SignalKind.XID]

    n = p.now
    assert xids(p.poll(xid=xid_body(n, (n - 30, "0"), (n, "0")))) == []  # baseline
    assert xids(p.poll(xid=xid_body(n, (n + 5, "+Inf"), (n + 10, "NaN"), (n + 14, "79")))) \
        == [79.0]
    assert p.src.last_poll is not None
    assert p.src.last_poll.malformed_samples == 2  # dropped points of a usable series
    assert p.src.drops.counts == {("xid", "inf"): 1, ("xid", "nan"): 1}
    assert xids(p.poll(xid=xid_body(n, (n + 14, "79"), (n + 20, "+Inf")))) == []  # once
    assert xids(p.poll(xid=xid_body(n, (n + 40, "48")))) == [48.0]
    # quiet GPUs (every sample "0", cursor at "no XID") only advance the cursor
    assert xids(p.poll(xid=xid_body(n, (n + 50, "0"), (n + 55, "0")))) == []
    assert xids(p.poll(xid=xid_body(n, (n + 55, "0"), (n + 70, "79")))) == [79.0]


def test_parse_poll_is_the_poll_path() -> None:
    src = PrometheusSource("http://127.0.0.1:1", policies(temp_rule(),
                           XidRule("x", Severity.FAILED, frozenset({79}))))
    try:
        exprs = src.poll_queries(T)
        assert exprs[0] == src.freshness_query
        assert exprs[1] == src.xid_prequery(T)  # the raw samples come in a follow-up
        assert exprs[2:] == [q.expr for q in src.plan.metrics]
        sigs = src.parse_poll(T, {})  # nothing answered: Prometheus unreachable
        assert sigs == []
        assert src.last_poll is not None
        assert src.last_poll.outage
        assert src.last_poll.failed_queries == 3
    finally:
        src.close()


def test_xid_prequery_first_poll_lists_everything_non_zero() -> None:
    assert xid_prequery_expr(600, by=("Hostname", "gpu")) == (
        "max by (Hostname, gpu) (max_over_time(DCGM_FI_DEV_XID_ERRORS[10m]) > 0 or "
        "changes(DCGM_FI_DEV_XID_ERRORS[10m]) > 0 or "
        "max_over_time(DCGM_EXP_XID_ERRORS_COUNT[10m]) > 0 or "
        'count_over_time(DCGM_EXP_XID_ERRORS_COUNT{xid!=""}[10m]))')


def test_xid_prequery_later_polls_list_only_what_is_new() -> None:
    g, c = 'DCGM_FI_DEV_XID_ERRORS{job="dcgm"}', 'DCGM_EXP_XID_ERRORS_COUNT{job="dcgm",xid!=""}'
    got = xid_prequery_expr(45, by=("Hostname", "gpu"), matchers={"job": "dcgm"},
                            first=False)
    assert got == (
        f"max by (Hostname, gpu) (changes({g}[45s]) > 0 or changes({c}[45s]) > 0 or "
        f"(max_over_time({g}[45s]) > 0 unless count_over_time({g}[45s] offset 45s)) or "
        f"(count_over_time({c}[45s]) unless count_over_time({c}[45s] offset 45s)) or "
        f"(count_over_time({c}[45s] offset 45s) unless count_over_time({c}[45s])))")
    # no "the gauge is non-zero" or "a count series exists": those stay true for ever
    assert "max_over_time(DCGM_FI_DEV_XID_ERRORS{job=\"dcgm\"}[45s]) > 0 or" not in got


def test_source_xid_prequery_is_the_first_polls_until_an_xid_poll_completed() -> None:
    src = PrometheusSource("http://127.0.0.1:1",
                           policies(XidRule("x", Severity.FAILED, frozenset({79}))))
    try:
        assert "offset" not in src.xid_prequery(T)  # the first poll: everything non-zero
        src.parse_poll(T, {src.freshness_query: heartbeat(T, ("a", 0)),
                           src.xid_prequery(T): body([])})
        assert "offset" in src.xid_prequery(T + 15)  # then only what is new
    finally:
        src.close()
