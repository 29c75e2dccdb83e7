"""Fabric health: metric rules on any series (``series``, ``per``, ``nodeLabel``, ``changes``),
PromQL whose result must keep the node label, per-port signals and evidence, and the shipped
InfiniBand policy (``policies/examples/infiniband.yaml``) decided port by port."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healer.adapters.prometheus import PrometheusSource
from healer.adapters.prometheus.promql import TAG_LABEL, group_labels, metric_expr
from healer.core.health import evaluate
from healer.core.model import HealthState, Incident, Severity, Signal, SignalKind
from healer.core.parts import PartRef
from healer.core.rules import Aggregation, MetricRule, Op, Policy, PolicySet
from healer.core.rules import LabelSelector as Sel
from healer.core.signals import NodeSignals, RuleIndex
from healer.policy.load import load_policy_set
from healer.policy.promql_labels import check_keeps

ROOT = Path(__file__).resolve().parents[2]
IB_POLICY = ROOT / "policies" / "examples" / "infiniband.yaml"
T = 1_700_000_000.0
STATE = "node_infiniband_state_id"


def ib() -> Policy:
    (policy,) = load_policy_set([IB_POLICY]).policies
    return policy


def rule(name: str) -> MetricRule:
    (r,) = [r for r in ib().rules if r.name == name]
    assert isinstance(r, MetricRule)
    return r


def port(device: str = "mlx5_0", number: str = "1") -> PartRef:
    return PartRef((("device", device), ("port", number)))


# -- query generation ---------------------------------------------------------------------


def _series(**kw: Any) -> MetricRule:
    base: dict[str, Any] = {"name": "r", "severity": Severity.FAILED, "field": STATE,
                            "op": Op.GT, "threshold": 1.0, "series": True}
    return MetricRule(**{**base, **kw})


@pytest.mark.parametrize(("given", "expected"), [
    (_series(), f"max by (Hostname, hostname) ({STATE})"),
    (_series(node_label="node", per=("device", "port")),
     f"max by (node, device, port) ({STATE})"),
    (_series(op=Op.LT, per=("device",)), f"min by (Hostname, hostname, device) ({STATE})"),
    (_series(aggregation=Aggregation.CHANGES, window=600, node_label="instance"),
     f"max by (instance) (changes({STATE}[10m]))"),
    (_series(field="node_infiniband_link_downed_total", aggregation=Aggregation.INCREASE,
             window=90, matchers=(("device", 'mlx5_"0'),), node_label="node"),
     'max by (node) (increase(node_infiniband_link_downed_total{device="mlx5_\\"0"}[90s]))'),
    (MetricRule("d", Severity.FAILED, "DCGM_FI_DEV_GPU_TEMP", Op.GT, 1.0,
                aggregation=Aggregation.CHANGES, window=60),
     "max by (Hostname, hostname, instance, gpu, UUID, uuid, DCGM_FI_DEV_SERIAL) "
     "(changes(DCGM_FI_DEV_GPU_TEMP[1m]))"),
])
def test_series_rule_queries(given: MetricRule, expected: str) -> None:
    # a series rule takes neither the source's DCGM matchers nor its join
    got = metric_expr(given, by=group_labels(), matchers={"job": "dcgm"} if given.series
                      else None, join="* on(instance) group_left() x" if given.series else "")
    assert got == expected


def test_keys_tell_matchers_windows_and_parts_apart() -> None:
    keys = {_series().key, _series(per=("device",)).key,
            _series(matchers=(("device", "mlx5_0"),)).key,
            _series(aggregation=Aggregation.CHANGES, window=60).key,
            _series(aggregation=Aggregation.CHANGES, window=120).key}
    assert len(keys) == 5
    assert MetricRule("d", Severity.FAILED, "F", Op.GT, 1.0).key == "F"  # unchanged for DCGM


def test_shipped_policy_is_one_query_per_rule_whatever_the_fleet() -> None:
    src = PrometheusSource("http://127.0.0.1:1", load_policy_set([IB_POLICY]), stale_after=60)
    try:
        assert len(src.plan.metrics) == 5
        assert src.plan.queries_per_poll == 6  # + freshness; no XID rule, no per-node query
        assert all("mlx5" not in e and "Hostname" not in e for e in src.poll_queries(T)[1:])
    finally:
        src.close()


# -- PromQL that must keep the node label ---------------------------------------------------


@pytest.mark.parametrize(("expr", "node", "per", "error"), [
    ("rate(x[5m])", "Hostname", (), ""),
    ("max by (Hostname, device) (x) > 3", "Hostname", ("device",), ""),
    ("sum without (gpu) (x)", "Hostname", (), ""),
    ("x * on(instance) group_left(node) kube_node_info", "node", (), ""),
    ("label_replace(sum by (instance) (x), \"node\", \"$1\", \"instance\", \"(.*)\")", "node",
     (), ""),
    ("absent(x{node=\"a\"})", "node", (), ""),
    ("topk(3, x)", "Hostname", (), ""),
    ("x and on(node) y", "node", (), ""),
    ("sum(x) or max by (node) (y)", "node", (), ""),
    ("sum(rate(x[5m]))", "Hostname", (), "drops it"),
    ("max by (device) (x)", "Hostname", (), "drops it"),
    ("sum without (Hostname, hostname) (x)", "Hostname", (), "drops it"),
    ("x * on(gpu) y", "Hostname", (), "drops it"),
    ("scalar(x) + 1", "Hostname", (), "a scalar"),
    ("count_values(\"v\", x)", "node", (), "drops it"),
    ("max by (node) (x)", "node", ("device", "port"), "drops device, port"),
])
def test_promql_result_labels(expr: str, node: str, per: tuple[str, ...], error: str) -> None:
    nodes = ("Hostname", "hostname") if node == "Hostname" else (node,)
    if not error:
        check_keeps(expr, nodes, per)
        return
    with pytest.raises(ValueError, match=error):
        check_keeps(expr, nodes, per)


# -- parsing: per-port signals and their recovery ------------------------------------------


def body(result: list[Any]) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": "vector", "result": result}}).encode()


def heartbeat(now: float, *nodes: str) -> bytes:
    return body([{"metric": {"Hostname": n, "instance": f"{n}:9400", "gpu": "0",
                             "UUID": f"GPU-{n}"}, "value": [now, str(now - 1)]} for n in nodes])


def ib_row(node: str, device: str, value: str, *, extra: dict[str, str] | None = None
           ) -> dict[str, Any]:
    return {"metric": {"node": node, "device": device, "port": "1", **(extra or {})},
            "value": [T, value]}


def test_a_down_port_is_one_signal_naming_node_and_port_then_one_recovery() -> None:
    src = PrometheusSource("http://127.0.0.1:1", load_policy_set([IB_POLICY]), stale_after=60)
    try:
        q = next(q for q in src.plan.metrics if q.rules == ("infiniband/ib-port-not-active",))
        i = src.plan.metrics.index(q)
        down = body([ib_row("a", "mlx5_1", "1"), ib_row("zz", "mlx5_0", "1")])  # zz: no node
        sigs = src.parse_poll(T, {src.freshness_query: heartbeat(T, "a", "b"), q.expr: down})
        metric = [s for s in sigs if s.kind is SignalKind.METRIC]
        assert [(s.node, s.gpu, s.part, s.value, s.observed_at) for s in metric] == [
            ("a", None, port("mlx5_1"), 1.0, T - 1)]  # stamped with the node's heartbeat
        assert src.parser.host_of["a"] == ("Hostname", "a")  # never learnt from `node`
        now = T + 15  # the port came back: absent from the filtered answer
        src.parse_poll(now, {src.freshness_query: heartbeat(now, "a", "b"), q.expr: body([])})
        (follow,) = src.follow_up_queries(now)
        assert follow == f'label_replace({q.base}, "{TAG_LABEL}", "{i}", "", "")'
        back = body([{**ib_row(n, d, "4", extra={TAG_LABEL: str(i)}), "value": [now, "4"]}
                     for n, d in (("a", "mlx5_0"), ("a", "mlx5_1"), ("b", "mlx5_0"))])
        sigs = src.parse_poll(now, {follow: back})
        assert [(s.node, s.part, s.value) for s in sigs] == [("a", port("mlx5_1"), 4.0)]
    finally:
        src.close()


def test_a_promql_rule_with_per_labels_is_judged_per_port() -> None:
    expr = f"min by (node, device, port) ({STATE}) < 4"
    r = MetricRule("down", Severity.FAILED, "down", Op.LT, 4.0, promql=expr,
                   per=("device", "port"), node_label="node")
    src = PrometheusSource("http://127.0.0.1:1", PolicySet((Policy("p", Sel(), (r,)),)),
                           stale_after=60)
    try:
        (q,) = src.plan.metrics
        assert q.base == expr  # as given: no source matchers, no join
        sigs = src.parse_poll(T, {src.freshness_query: heartbeat(T, "a"),
                                  q.expr: body([ib_row("a", "mlx5_0", "2"),
                                                ib_row("a", "mlx5_1", "1")])})
        assert sorted((s.node, s.part, s.value) for s in sigs
                      if s.kind is SignalKind.METRIC) == [
            ("a", port("mlx5_0"), 2.0), ("a", port("mlx5_1"), 1.0)]
    finally:
        src.close()


# -- health, port by port -------------------------------------------------------------------


def sample(key_of: str, value: float, at: float, part: PartRef | None = None,
           node: str = "n") -> Signal:
    return Signal(node, "dcgm", SignalKind.METRIC, rule(key_of).key, value, at,
                  part=part or port())


HEALTH_CASES = [
    ("healthy fabric", [], HealthState.HEALTHY, ""),
    ("port down held a minute",
     [sample("ib-port-not-active", 1, T - 61), sample("ib-port-not-active", 1, T)],
     HealthState.FAILED, "on device mlx5_0 port 1"),
    ("port down for 10 s only", [sample("ib-port-not-active", 1, T - 10),
                                 sample("ib-port-not-active", 1, T)], HealthState.SUSPECT, ""),
    ("physical link disabled", [sample("ib-link-not-up", 3, T - 90),
                                sample("ib-link-not-up", 3, T)], HealthState.FAILED, "port 1"),
    ("link went down", [sample("ib-link-downed", 1, T)], HealthState.FAILED, "link_downed"),
    ("flapping link", [sample("ib-link-flapping", 6, T, port("mlx5_1"))],
     HealthState.DEGRADING, "changes node_infiniband_state_id >= 4 (value 6) on device "
                            "mlx5_1 port 1"),
    ("symbol errors rising", [sample("ib-symbol-errors", 50, T)], HealthState.DEGRADING,
     "symbol_error"),
    ("flapping on one port, down on the other: the worst",
     [sample("ib-link-flapping", 6, T, port("mlx5_1")), sample("ib-link-downed", 1, T)],
     HealthState.FAILED, "mlx5_0"),
    ("another port's healthy sample does not hide a down port",
     [sample("ib-port-not-active", 1, T - 70), sample("ib-port-not-active", 4, T - 5,
                                                      port("mlx5_1")),
      sample("ib-port-not-active", 1, T)], HealthState.FAILED, "mlx5_0 port 1"),
    ("a port that came back", [sample("ib-port-not-active", 1, T - 70),
                               sample("ib-port-not-active", 4, T)], HealthState.HEALTHY, ""),
]


@pytest.mark.parametrize(("case", "signals", "state", "detail"), HEALTH_CASES,
                         ids=[c[0] for c in HEALTH_CASES])
def test_infiniband_policy_decides_per_port(case: str, signals: list[Signal],
                                            state: HealthState, detail: str) -> None:
    v = evaluate("n", signals, ib(), T)
    assert v.state is state, case
    assert detail in v.summary()
    if state.is_confirmed:
        assert v.evidence
        assert all(s.part is not None for s in v.evidence)
        assert v.gpus == ()


def test_evidence_names_the_port_through_the_record() -> None:
    v = evaluate("n", [sample("ib-link-downed", 2, T, port("mlx5_1", "2"))], ib(), T)
    inc = Incident("n-1", "n", T, Severity.FAILED, v.rules, v.gpus, v.summary(), v.evidence)
    (ev,) = inc.to_dict()["evidence"]
    assert ev["part"] == {"device": "mlx5_1", "port": "2"}
    assert Incident.from_dict(inc.to_dict()) == inc


def test_bounded_state_keeps_each_port_apart() -> None:
    ps = PolicySet((ib(),))
    state = NodeSignals(RuleIndex.of(ps))
    state.extend([sample("ib-port-not-active", 1, T - 70),
                  sample("ib-port-not-active", 4, T - 60, port("mlx5_1")),
                  sample("ib-port-not-active", 1, T)])
    assert evaluate("n", state.signals(T), ib(), T).state is HealthState.FAILED


PORTS = (port("mlx5_0"), port("mlx5_1"), port("mlx5_1", "2"))
RULES = ("ib-port-not-active", "ib-link-downed", "ib-link-flapping")
#: (seconds since the previous sample, rule, port, value)
STREAMS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2), st.integers(0, 2),
                             st.sampled_from([0.0, 1.0, 4.0, 6.0])), max_size=40)
_RANK = [HealthState.HEALTHY, HealthState.SUSPECT, HealthState.STALE, HealthState.DEGRADING,
         HealthState.FAILED]


@settings(max_examples=200, deadline=None)
@given(STREAMS)
def test_ports_are_judged_apart_and_the_bounded_state_agrees(
        stream: list[tuple[int, int, int, float]]) -> None:
    """A node's verdict is the worst of its ports' verdicts judged alone, and the engine's
    bounded state decides like the full history."""
    policy = ib()
    state = NodeSignals(RuleIndex.of(PolicySet((policy,))))
    full: list[Signal] = []
    t = T - 2000
    last: dict[tuple[int, int], float] = {}
    for dt, r, p, value in stream:
        t += dt
        if last.get((r, p)) == t:
            continue  # one sample per series and time, as Prometheus stores them
        last[(r, p)] = t
        s = sample(RULES[r], value, t, PORTS[p])
        full.append(s)
        state.add(s)
    now = t + 1
    whole = evaluate("n", full, policy, now)
    alone = [evaluate("n", [s for s in full if s.part == p], policy, now) for p in PORTS]
    assert whole.state is max((v.state for v in alone), key=_RANK.index)
    assert set(whole.rules) == {r for v in alone for r in v.rules}
    bounded = evaluate("n", state.signals(now), policy, now)
    assert (bounded.state, bounded.rules, bounded.summary()) == (
        whole.state, whole.rules, whole.summary())


def test_history_reads_series_per_port() -> None:
    """The backtest's range answers: one signal per node, port and step."""
    src = PrometheusSource("http://127.0.0.1:1", load_policy_set([IB_POLICY]), stale_after=60)
    try:
        q = next(q for q in src.plan.metrics if q.rules == ("infiniband/ib-link-flapping",))
        answer = [{"metric": {"node": "a", "device": d, "port": "1"},
                   "values": [[T, v], [T + 15, v]]} for d, v in (("mlx5_0", "0"),
                                                                  ("mlx5_1", "6"))]
        sigs = src.parser.metric_history(q, answer)
        assert sorted((s.part.describe() if s.part else "", s.observed_at, s.value)
                      for s in sigs) == [("device mlx5_0 port 1", T, 0.0),
                                         ("device mlx5_0 port 1", T + 15, 0.0),
                                         ("device mlx5_1 port 1", T, 6.0),
                                         ("device mlx5_1 port 1", T + 15, 6.0)]
        assert {s.gpu for s in sigs} == {None}
    finally:
        src.close()


@pytest.mark.parametrize(("rule_name", "raw", "kept"), [
    ("ib-port-not-active", "1", True),
    ("ib-port-not-active", "9", False),  # no port state 9: dropped, counted
    ("ib-port-not-active", "-1", False),
    ("ib-link-not-up", "8", False),
    ("ib-link-not-up", "3", True),
    ("ib-link-downed", "-2", False),  # a counter's increase is never negative
    ("ib-link-flapping", "-1", False),  # nor a count of changes
    ("ib-link-flapping", "NaN", False),
])
def test_impossible_port_samples_are_dropped(rule_name: str, raw: str, kept: bool) -> None:
    src = PrometheusSource("http://127.0.0.1:1", load_policy_set([IB_POLICY]), stale_after=60)
    try:
        q = next(q for q in src.plan.metrics if q.rules == (f"infiniband/{rule_name}",))
        sigs = src.parse_poll(T, {src.freshness_query: heartbeat(T, "a"),
                                  q.expr: body([ib_row("a", "mlx5_0", raw)])})
        metric = [s for s in sigs if s.kind is SignalKind.METRIC]
        assert bool(metric) is kept
        assert (sum(src.drops.counts.values()) == 0) is kept
    finally:
        src.close()
