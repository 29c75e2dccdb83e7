"""Health evaluation, rule kind by rule kind (table-driven)."""

from __future__ import annotations

import re

import pytest

from healer.core import policy as cp
from healer.core.health import evaluate, evaluate_node
from healer.core.model import GpuRef, HealthState, Severity, Signal, SignalKind
from tests.builders import T0, policy

H = HealthState
G0, G1 = GpuRef(0, "GPU-a", "S0"), GpuRef(1, "GPU-b", "S1")


def xid(code: int, t: float, gpu: GpuRef | None = G0) -> Signal:
    return Signal("n1", "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", float(code), t, gpu)


def metric(field: str, value: float, t: float, gpu: GpuRef | None = G0) -> Signal:
    return Signal("n1", "dcgm", SignalKind.METRIC, field, value, t, gpu)


def cond(type_: str, status: str, since: float, t: float, reason: str = "") -> Signal:
    return Signal("n1", "k8s", SignalKind.CONDITION, type_, since, t, None,
                  Signal.details(status=status, reason=reason))


def fresh(t: float, source: str = "dcgm") -> Signal:
    return Signal("n1", source, SignalKind.FRESH, source, 1.0, t)


def stale(t: float, source: str = "dcgm") -> Signal:
    return Signal("n1", source, SignalKind.STALE, source, 0.0, t)


XID_FATAL = cp.XidRule("fatal", Severity.FAILED, frozenset({79, 48}))
XID_13 = cp.XidRule("xid13", Severity.DEGRADING, frozenset({13}), count=3, within=600)
HOT = cp.MetricRule("hot", Severity.DEGRADING, "DCGM_FI_DEV_GPU_TEMP", cp.Op.GE, 90, hold_for=300)
DBE = cp.MetricRule("dbe", Severity.FAILED, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", cp.Op.GT, 0,
                    aggregation=cp.Aggregation.INCREASE)
GPU_HEALTHY = cp.ConditionRule("agent", Severity.FAILED, "GPUHealthy", frozenset({"False"}),
                               re.compile("^Xid"), hold_for=30)
FLAPPING = cp.ConditionRule("flap", Severity.DEGRADING, "KernelDeadlock", frozenset({"True"}),
                            None, 0, count=3, within=3600)
STALE = cp.StalenessRule("stale", after=120)

CASES = [
    # id, rules, signals, now offset, expected state, expected matched rules, recheck (approx)
    ("no-signals-healthy", (XID_FATAL,), [], 0, H.HEALTHY, (), None),
    ("fatal-xid-fails", (XID_FATAL,), [xid(79, T0)], 1, H.FAILED, ("fatal",), 3599),
    ("other-xid-ignored", (XID_FATAL,), [xid(13, T0)], 1, H.HEALTHY, (), None),
    ("xid-ages-out", (XID_FATAL,), [xid(79, T0)], 3601, H.HEALTHY, (), None),
    ("xid-n-in-window-suspect", (XID_13,), [xid(13, T0), xid(13, T0 + 10)], 20, H.SUSPECT,
     (), 580),
    ("xid-n-in-window-confirmed", (XID_13,), [xid(13, T0), xid(13, T0 + 10), xid(13, T0 + 20)],
     30, H.DEGRADING, ("xid13",), 570),
    ("xid-n-in-window-spread-out", (XID_13,), [xid(13, T0), xid(13, T0 + 500),
                                               xid(13, T0 + 1000)], 1001, H.SUSPECT, (), 99),
    ("metric-below-threshold", (HOT,), [metric("DCGM_FI_DEV_GPU_TEMP", 70, T0)], 1, H.HEALTHY,
     (), 299),
    ("metric-for-not-yet-held", (HOT,), [metric("DCGM_FI_DEV_GPU_TEMP", 95, T0),
                                         metric("DCGM_FI_DEV_GPU_TEMP", 96, T0 + 100)], 100,
     H.SUSPECT, (), 200),
    ("metric-for-held", (HOT,), [metric("DCGM_FI_DEV_GPU_TEMP", 95, T0 + i * 60)
                                 for i in range(7)], 360, H.DEGRADING, ("hot",), 300),
    ("metric-for-resets-on-dip", (HOT,), [metric("DCGM_FI_DEV_GPU_TEMP", 95, T0),
                                          metric("DCGM_FI_DEV_GPU_TEMP", 80, T0 + 200),
                                          metric("DCGM_FI_DEV_GPU_TEMP", 95, T0 + 300),
                                          metric("DCGM_FI_DEV_GPU_TEMP", 95, T0 + 400)], 400,
     H.SUSPECT, (), 200),
    ("metric-old-sample-untrusted", (HOT,), [metric("DCGM_FI_DEV_GPU_TEMP", 99, T0)], 400,
     H.HEALTHY, (), None),
    ("metric-per-gpu", (DBE,), [metric(DBE.key, 0, T0, G0), metric(DBE.key, 2, T0, G1)], 1,
     H.FAILED, ("dbe",), 299),
    ("condition-held", (GPU_HEALTHY,), [cond("GPUHealthy", "False", T0, T0 + 40, "XidFatal")],
     40, H.FAILED, ("agent",), None),
    ("condition-not-held-yet", (GPU_HEALTHY,), [cond("GPUHealthy", "False", T0, T0 + 10,
                                                     "XidFatal")], 10, H.SUSPECT, (), 20),
    ("condition-reason-mismatch", (GPU_HEALTHY,), [cond("GPUHealthy", "False", T0, T0 + 40,
                                                        "Thermal")], 40, H.HEALTHY, (), None),
    ("condition-latest-wins", (GPU_HEALTHY,), [cond("GPUHealthy", "False", T0, T0 + 40, "Xid"),
                                               cond("GPUHealthy", "True", T0 + 50, T0 + 60)], 60,
     H.HEALTHY, (), None),
    ("condition-flapping-counted", (FLAPPING,), [cond("KernelDeadlock", "True", T0 + i * 100,
                                                      T0 + i * 100 + 1) for i in range(3)], 301,
     H.DEGRADING, ("flap",), 3299),
    ("condition-flapping-too-few", (FLAPPING,), [cond("KernelDeadlock", "True", T0, T0 + 1)],
     2, H.SUSPECT, (), 3598),
    ("stale-no-telemetry-at-all", (XID_FATAL, STALE), [], 1, H.STALE, (), None),
    ("fresh-heartbeat-healthy", (XID_FATAL, STALE), [fresh(T0)], 60, H.HEALTHY, (), 60),
    ("stale-after-silence", (XID_FATAL, STALE), [fresh(T0)], 200, H.STALE, (), None),
    ("stale-marker-wins", (XID_FATAL, STALE), [fresh(T0), stale(T0 + 1)], 2, H.STALE, (), None),
    ("stale-never-healthy-even-with-hot-metric-untrusted", (HOT, STALE),
     [metric("DCGM_FI_DEV_GPU_TEMP", 99, T0)], 200, H.STALE, (), None),
    ("fatal-xid-beats-stale", (XID_FATAL, STALE), [xid(79, T0)], 200, H.FAILED, ("fatal",),
     3400),
    ("failed-beats-degrading", (XID_FATAL, DBE), [xid(79, T0), metric(DBE.key, 1, T0)],
     1, H.FAILED, ("fatal", "dbe"), 299),
]


@pytest.mark.parametrize(("rules", "signals", "dt", "state", "matched", "recheck"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_evaluate(rules: tuple[cp.Rule, ...], signals: list[Signal], dt: float,
                  state: HealthState, matched: tuple[str, ...], recheck: float | None) -> None:
    v = evaluate("n1", signals, policy(rules=rules), T0 + dt)
    assert v.state is state, v.matches
    assert set(v.rules) == set(matched)
    if recheck is None:
        assert v.recheck_after is None
    else:
        assert v.recheck_after == pytest.approx(recheck, abs=1)


def test_gpu_entities_are_reported() -> None:
    v = evaluate("n1", [metric(DBE.key, 3, T0, G1), metric(DBE.key, 0, T0, G0)],
                 policy(rules=(DBE,)), T0 + 1)
    assert v.gpus == (G1,)
    assert "GPU 1" in v.summary()


def test_signals_of_other_nodes_and_the_future_are_ignored() -> None:
    other = Signal("n2", "dcgm", SignalKind.XID, "x", 79.0, T0, G0)
    future = xid(79, T0 + 100)
    v = evaluate("n1", [other, future], policy(rules=(XID_FATAL,)), T0 + 1)
    assert v.state is H.HEALTHY


def test_worst_policy_wins_and_names_itself() -> None:
    fatal = policy("fatal", rules=(XID_FATAL,))
    hot = policy("hot", rules=(DBE,))
    sigs = [metric(DBE.key, 1, T0)]
    v = evaluate_node("n1", sigs, [fatal, hot], T0 + 1)
    assert v.state is H.FAILED
    assert v.policy == "hot"
    assert evaluate_node("n1", [], [], T0).state is H.HEALTHY


def test_metric_keys_keep_aggregations_apart() -> None:
    a = cp.MetricRule("a", Severity.FAILED, "F", cp.Op.GT, 0)
    b = cp.MetricRule("b", Severity.FAILED, "F", cp.Op.GT, 0, aggregation=cp.Aggregation.INCREASE,
                      window=600)
    c = cp.MetricRule("c", Severity.FAILED, "F", cp.Op.GT, 0, aggregation=cp.Aggregation.INCREASE,
                      window=60)
    assert len({a.key, b.key, c.key}) == 3
    assert b.key == "increase(F[600s])"
