"""The engine's bounded signal state and its wake-up rules.

* :class:`NodeSignals` gives :func:`evaluate` the same verdict as the full history would
  (hypothesis, over random streams of every signal kind), while holding a bounded number of
  signals however long the stream runs;
* :class:`Engine` wakes a node only for signals that can change its verdict, and an incident
  that only a new verdict or an event can move does not tick.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from healer.core import rules as cp
from healer.core.engine import Engine
from healer.core.health import Verdict, evaluate
from healer.core.machine import Decision
from healer.core.model import GpuRef, Guardrail, GuardrailBlock, HealthState, Signal, SignalKind
from healer.core.phases import Phase
from healer.core.signals import NodeSignals, RuleIndex
from tests.builders import T0, node, policy, record
from tests.unit.test_health import (
    DBE,
    FLAPPING,
    GPU_HEALTHY,
    HOT,
    STALE,
    XID_13,
    XID_FATAL,
    cond,
    fresh,
    metric,
    stale,
    xid,
)

G0, G1 = GpuRef(0, "GPU-a", "S0"), GpuRef(1, "GPU-b", "S1")
COLD = cp.MetricRule("cold", cp.Severity.FAILED, "DCGM_FI_DEV_GPU_TEMP", cp.Op.LT, 10,
                     hold_for=60)
RULES = (XID_FATAL, XID_13, HOT, COLD, DBE, GPU_HEALTHY, FLAPPING, STALE)
POLICY = policy("p", rules=RULES)
INDEX = RuleIndex.of(cp.PolicySet((POLICY,)))


def _signal(kind: int, t: float, value: int, gpu: int) -> Signal:
    g = (G0, G1)[gpu]
    match kind:
        case 0:
            return xid((79, 13, 13, 31)[value % 4], t, g)
        case 1:
            return metric("DCGM_FI_DEV_GPU_TEMP", (5.0, 50.0, 91.0, 95.0)[value % 4], t, g)
        case 2:
            return metric(DBE.key, float(value % 2), t, g)
        case 3:
            status = ("True", "False")[value % 2]
            return cond("GPUHealthy", status, T0 + 30 * (value % 3), t, reason="XidFatal")
        case 4:
            return cond("KernelDeadlock", "True", T0 + 100 * (value % 6), t)
        case 5:
            return stale(t)
        case _:
            return fresh(t)


STREAMS = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 400), st.integers(0, 11),
                             st.integers(0, 1)), min_size=1, max_size=40)


def _same(a: Verdict, b: Verdict) -> None:
    assert (a.state, a.severity, a.rules, a.gpus, a.summary(), a.recheck_after) == \
        (b.state, b.severity, b.rules, b.gpus, b.summary(), b.recheck_after)
    assert [(m.rule, m.state, m.since) for m in a.matches] == \
        [(m.rule, m.state, m.since) for m in b.matches]


@settings(max_examples=300, deadline=None)
@given(STREAMS)
def test_the_bounded_state_decides_like_the_full_history(
        stream: list[tuple[int, int, int, int]]) -> None:
    store = NodeSignals(INDEX)
    full: list[Signal] = []
    t = T0
    for kind, dt, value, gpu in stream:
        t += dt
        sig = _signal(kind, t, value, gpu)
        if sig.kind is SignalKind.XID and sig in full:
            continue  # the same occurrence reported twice counts once (the engine dedupes)
        full.append(sig)
        store.add(sig)
        for later in (t + 59, t + 301, t + 3000):  # a look ahead prunes: on a copy
            _same(evaluate("n1", copy.deepcopy(store).signals(later), POLICY, later),
                  evaluate("n1", full, POLICY, later))
        _same(evaluate("n1", store.signals(t), POLICY, t), evaluate("n1", full, POLICY, t))


def test_state_per_node_does_not_grow_with_uptime() -> None:
    store = NodeSignals(INDEX)
    sizes = []
    t = T0
    for poll in range(20_000):  # 3.5 days of 15 s polls
        t += 15
        for g in (G0, G1):
            store.add(metric("DCGM_FI_DEV_GPU_TEMP", 60.0 + (poll % 40), t, g))
            store.add(metric(DBE.key, float(poll % 7 == 0), t, g))
        store.add(fresh(t))
        if poll % 50 == 0:
            store.add(xid(13, t, G0))
            store.add(cond("KernelDeadlock", "True", t, t))
        if poll % 1000 == 999:
            store.signals(t)
            sizes.append(store.size())
    assert max(sizes) == min(sizes[1:]) or max(sizes) <= 2 * min(sizes)
    assert max(sizes) < 64 + 16 + 4 * 5 + 4


def _engine(mode: cp.Mode = cp.Mode.ACT) -> Engine:
    pol = policy("p", rules=(XID_FATAL, HOT, STALE), mode=mode)
    e = Engine(cp.PolicySet((pol,)))
    e.set_node(node("n1"))
    return e


def test_only_new_information_wakes_a_node() -> None:
    e = _engine()
    assert e.ingest([fresh(T0)]) == {"n1"}  # never evaluated
    e.evaluate("n1", T0)
    assert e.ingest([fresh(T0 + 15)]) == set()  # a heartbeat of a fresh node
    assert e.ingest([metric("DCGM_FI_DEV_GPU_TEMP", 50, T0 + 15)]) == {"n1"}
    e.evaluate("n1", T0 + 15)
    assert e.ingest([metric("DCGM_FI_DEV_GPU_TEMP", 50, T0 + 30)]) == set()  # same value
    assert e.ingest([metric("DCGM_FI_DEV_GPU_TEMP", 51, T0 + 45)]) == {"n1"}
    e.evaluate("n1", T0 + 45)
    assert e.ingest([xid(79, T0 + 50)]) == {"n1"}
    e.evaluate("n1", T0 + 50)
    assert e.ingest([xid(79, T0 + 50)]) == set()  # re-reported: the same occurrence


def test_an_observe_held_incident_does_not_tick() -> None:
    e = _engine(cp.Mode.OBSERVE)
    rec = record(Phase.FAILED,
                 blocked=GuardrailBlock(Guardrail.OBSERVE_ONLY, "the policy observes"))
    assert e.next_tick("n1", Decision(rec, recheck_after=60.0), T0) is None
    moving = replace(rec, blocked=None)
    assert e.next_tick("n1", Decision(moving, recheck_after=60.0), T0) == T0 + 60.0
    assert e.set_policies(e.policies) == []  # nothing open yet: nothing to look at again


def test_a_stale_node_wakes_on_its_next_heartbeat() -> None:
    e = _engine()
    e.ingest([stale(T0)])
    assert e.evaluate("n1", T0).verdict is not None
    assert e.last_state["n1"] is HealthState.STALE
    assert e.ingest([fresh(T0 + 15)]) == {"n1"}


def test_only_decisions_that_take_capacity_are_written_under_the_fleet_lock() -> None:
    from healer.core.engine import takes_capacity
    from healer.core.model import StepOutcome, StepRecord

    failed = record(Phase.FAILED)
    drain = StepRecord("drain", T0, finished_at=T0 + 1, outcome=StepOutcome.DONE)
    draining = record(Phase.DRAINING, ledger=(drain,))
    cordoned = record(Phase.CORDONED, ledger=(drain,))
    done = record(Phase.DONE)
    suspect = record(Phase.SUSPECT)
    assert takes_capacity(None, Decision(failed))  # a new incident counts for the breaker
    assert takes_capacity(suspect, Decision(failed))
    assert takes_capacity(failed, Decision(draining))  # admission: a slot, a node out
    assert not takes_capacity(draining, Decision(cordoned))  # already counted
    assert not takes_capacity(cordoned, Decision(done))  # gives capacity back
    assert not takes_capacity(None, Decision(suspect))
    assert not takes_capacity(failed, Decision(None))
