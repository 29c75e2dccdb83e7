"""Health evaluation, rule kind by rule kind (table-driven)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from healer.agent.main import add_agent_flags
from healer.agent.publish import DEFAULT_HEARTBEAT
from healer.core import rules as cp
from healer.core.health import evaluate, evaluate_node
from healer.core.model import (
    GpuRef,
    HealthState,
    NodeCondition,
    NodeView,
    Severity,
    Signal,
    SignalKind,
)
from healer.core.signals import (
    AGENT_HEARTBEAT,
    LIVENESS,
    NodeSignals,
    RuleIndex,
    condition_signals,
    default_stale_after,
    only_heartbeats,
)
from healer.policy.load import load_policy_set
from tests.builders import T0, policies, policy

H = HealthState
G0, G1 = GpuRef(0, "GPU-a", "S0"), GpuRef(1, "GPU-b", "S1")


def xid(code: int, t: float, gpu: GpuRef | None = G0) -> Signal:
    return Signal("n1", "dcgm", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", float(code), t, gpu)


def metric(field: str, value: float, t: float, gpu: GpuRef | None = G0) -> Signal:
    return Signal("n1", "dcgm", SignalKind.METRIC, field, value, t, gpu)


def cond(type_: str, status: str, since: float, t: float, reason: str = "") -> Signal:
    return Signal("n1", "k8s", SignalKind.CONDITION, type_, since, t, None,
                  Signal.details(status=status, reason=reason))


def beat(type_: str, status: str, since: float, heartbeat: float, reason: str = "") -> Signal:
    """A condition its detector vouches for: observed at its lastHeartbeatTime."""
    return Signal("n1", "k8s", SignalKind.CONDITION, type_, since, heartbeat, None,
                  Signal.details(status=status, reason=reason, liveness="heartbeat"))


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
NPD = cp.ConditionRule("npd-gpu", Severity.FAILED, "GPUProblem", frozenset({"True"}), None,
                       stale_after=1500)

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
    # a detector's heartbeat (lastHeartbeatTime) ages: past the window the condition is unknown
    ("condition-heartbeat-fresh", (NPD,), [beat("GPUProblem", "True", T0, T0 + 1200)], 1300,
     H.FAILED, ("npd-gpu",), 1400),
    ("condition-heartbeat-stale", (NPD,), [beat("GPUProblem", "True", T0, T0 + 100)], 1700,
     H.STALE, (), None),
    ("condition-healthy-stale-too", (NPD,), [beat("GPUProblem", "False", T0, T0)], 1500,
     H.STALE, (), None),
    ("condition-healthy-fresh-rechecks", (NPD,), [beat("GPUProblem", "False", T0, T0 + 600)],
     700, H.HEALTHY, (), 1400),
    ("condition-no-heartbeat-never-stale", (NPD,), [cond("GPUProblem", "True", T0, T0)], 9999,
     H.FAILED, ("npd-gpu",), None),
    ("condition-window-zero-never-stale", (replace(NPD, stale_after=0),),
     [beat("GPUProblem", "True", T0, T0)], 9999, H.FAILED, ("npd-gpu",), None),
    ("condition-stale-under-a-confirmed-xid", (NPD, XID_FATAL),
     [beat("GPUProblem", "True", T0, T0), xid(79, T0 + 1600)], 1601, H.FAILED, ("fatal",),
     3599),
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


def test_a_stale_condition_names_its_source_and_window() -> None:
    v = evaluate("n1", [beat("GPUProblem", "True", T0, T0 + 100, "NVLinkDown")],
                 policy(rules=(NPD,)), T0 + 1700)
    (m,) = v.matches
    assert m.state is H.STALE
    assert m.source == "condition/GPUProblem"
    assert "last heartbeat 26m40s ago (window 25m" in m.detail
    assert not v.rules  # nothing confirmed: the state machine takes no disruptive step


# -- the signal store and the runtime's conversion of node conditions ------------------------


def _view(hb: float, status: str = "True", since: float = T0) -> NodeView:
    return NodeView("n1", {}, {}, False, (), (
        NodeCondition("GPUProblem", status, "NVLinkDown", "link 3", since, hb),
        NodeCondition("Ready", "True", "KubeletReady", "", since)))


def test_condition_signals_carry_the_heartbeat_never_in_the_future() -> None:
    npd, ready = condition_signals(_view(T0 + 50), T0 + 60)
    assert (npd.observed_at, npd.value, npd.get(LIVENESS)) == (T0 + 50, T0, "heartbeat")
    assert (ready.observed_at, ready.get(LIVENESS)) == (T0 + 60, "")  # no heartbeat: now
    (ahead, _) = condition_signals(_view(T0 + 500), T0 + 60)  # the detector's clock runs ahead
    assert ahead.observed_at == T0 + 60


def test_a_heartbeat_alone_changes_no_verdict_but_refreshes_the_store() -> None:
    assert only_heartbeats(_view(T0), _view(T0 + 300))
    assert not only_heartbeats(_view(T0), _view(T0 + 300, status="False"))
    assert not only_heartbeats(None, _view(T0))
    store = NodeSignals(RuleIndex.of(policies(policy(rules=(NPD,)))))
    assert store.extend(condition_signals(_view(T0), T0))
    assert not store.extend(condition_signals(_view(T0 + 300), T0 + 300))  # a heartbeat
    assert store.conditions["GPUProblem"][-1].observed_at == T0 + 300
    # an older copy (re-seeded evidence) never moves the heartbeat back
    assert not store.extend(condition_signals(_view(T0 + 10), T0 + 400))
    assert store.conditions["GPUProblem"][-1].observed_at == T0 + 300


def test_default_heartbeat_windows_follow_the_detectors() -> None:
    assert default_stale_after("GPUHealthy") == 5 * AGENT_HEARTBEAT == 150
    assert default_stale_after("GPUProblem") == 25 * 60
    assert default_stale_after("Ready") == 0  # the node lifecycle controller does it
    # the agent's documented default is the one the controller's window assumes
    assert DEFAULT_HEARTBEAT == AGENT_HEARTBEAT
    p = argparse.ArgumentParser()
    add_agent_flags(p)
    assert p.parse_args([]).heartbeat == AGENT_HEARTBEAT


def test_policy_files_set_or_default_the_window(tmp_path: Path) -> None:
    doc = {"apiVersion": "healer.io/v1alpha1", "kind": "RemediationPolicy",
           "metadata": {"name": "npd"},
           "spec": {"nodeSelector": {"matchLabels": {"gpu": "yes"}}, "rules": [
               {"name": "agent", "severity": "failed",
                "condition": {"type": "GPUHealthy", "status": ["False"]}},
               {"name": "npd", "severity": "failed", "condition": {"type": "GPUProblem"}},
               {"name": "npd-fast", "severity": "failed",
                "condition": {"type": "KernelDeadlock", "staleAfter": "90s"}},
               {"name": "never", "severity": "failed",
                "condition": {"type": "Custom", "staleAfter": "0s"}},
               {"name": "nr", "severity": "failed", "notReady": {"for": "5m"}}]}}
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps(doc))
    (pol,) = load_policy_set([f]).policies
    windows = {r.name: r.stale_after for r in pol.rules if isinstance(r, cp.ConditionRule)}
    assert windows == {"agent": 150, "npd": 1500, "npd-fast": 90, "never": 0, "nr": 0}
