"""The dead verdict (issue 20 item 1) and the mass-death breaker (item 5), table-driven.

A node is dead when the witnesses its policy names agree: Ready Unknown/False for deadAfter,
Slurm NOT_RESPONDING, every telemetry source stale. Some but not all make it suspect. Many
nodes of a scope (or of one failure domain) going NotReady together is not a node fault.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from healer.core import rules as cp
from healer.core.budget import MassDeathFinding, check_admission, mass_death, outage
from healer.core.capacity import FleetIndex
from healer.core.health import evaluate
from healer.core.model import HealthState, NodeCondition, NodeView, Severity, Signal, SignalKind
from healer.core.slurm_signals import finding_signal, next_finding
from healer.core.topology import DOMAIN_LABEL
from tests.builders import DEAD_ON, T0, node, policies, policy, view

H = HealthState
ALL = cp.DeadNode(enabled=True, after=60)
ANY = replace(ALL, match=cp.DeadMatch.ANY)
THREE = replace(ALL, signals=frozenset(cp.DeadSignal))


def ready(status: str, since: float) -> Signal:
    """The Ready condition as the node-events source turns it into a signal."""
    return Signal("n1", "k8s", SignalKind.CONDITION, "Ready", since, since, None,
                  Signal.details(status=status, reason="NodeStatusUnknown"))


def slurm(*flags: str, base: str = "IDLE", since: float = T0 - 30) -> Signal:
    found = next_finding(None, base=base, flags=frozenset(flags), reason="Not responding",
                         now=since)
    return finding_signal("n1", found, since)


def metric(t: float, source: str = "dcgm") -> Signal:
    return Signal("n1", source, SignalKind.METRIC, "DCGM_FI_DEV_GPU_TEMP", 40.0, t)


NOW = T0
CASES = [
    # (case, policy's dead-node settings, signals, state, words in the detail)
    ("Ready for long, Slurm says NOT_RESPONDING: dead", ALL,
     [ready("Unknown", NOW - 120), slurm("NOT_RESPONDING")], H.DEAD,
     ("Ready=Unknown", "NOT_RESPONDING")),
    ("Ready False counts as much as Unknown", ALL,
     [ready("False", NOW - 61), slurm("NOT_RESPONDING", base="DOWN")], H.DEAD, ("DOWN",)),
    ("NotReady not yet deadAfter: suspect", ALL,
     [ready("Unknown", NOW - 10), slurm("NOT_RESPONDING")], H.SUSPECT, ("may be dead",)),
    ("NotReady long enough, Slurm still hears it: suspect (a kubelet crash)", ALL,
     [ready("Unknown", NOW - 600)], H.SUSPECT, ("not yet: slurmNotResponding",)),
    ("Slurm alone, Ready True: suspect", ALL,
     [ready("True", NOW - 600), slurm("NOT_RESPONDING")], H.SUSPECT, ("may be dead",)),
    ("any: Slurm alone is enough", ANY,
     [ready("True", NOW - 600), slurm("NOT_RESPONDING")], H.DEAD, ("NOT_RESPONDING",)),
    ("any: NotReady for deadAfter is enough", ANY, [ready("Unknown", NOW - 60)], H.DEAD,
     ("Ready=Unknown",)),
    ("healthy node", ALL, [ready("True", NOW - 600)], H.HEALTHY, ()),
    ("Slurm DOWN by an admin, responding: not a witness", ALL,
     [ready("Unknown", NOW - 600), slurm(base="DOWN")], H.SUSPECT, ("not yet",)),
    ("three witnesses, telemetry still fresh: suspect", THREE,
     [ready("Unknown", NOW - 600), slurm("NOT_RESPONDING"), metric(NOW - 5)], H.SUSPECT,
     ("telemetryStale",)),
    ("three witnesses, telemetry stale too: dead", THREE,
     [ready("Unknown", NOW - 600), slurm("NOT_RESPONDING"), metric(NOW - 900)], H.DEAD,
     ("every telemetry source stale",)),
    ("telemetry never reported: not a witness", THREE,
     [ready("Unknown", NOW - 600), slurm("NOT_RESPONDING")], H.SUSPECT, ("telemetryStale",)),
]


@pytest.mark.parametrize(("dead", "signals", "state", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_dead_verdict(dead: cp.DeadNode, signals: list[Signal], state: HealthState,
                      words: tuple[str, ...]) -> None:
    p = policy(rules=(cp.XidRule("fatal", Severity.FAILED, frozenset({79})),), dead=dead)
    v = evaluate("n1", signals, p, NOW)
    assert v.state is state, v.summary()
    for w in words:
        assert w in v.summary(), v.summary()
    if state is H.DEAD:
        assert v.severity is Severity.FAILED
        assert v.rules == (cp.DEAD_RULE,)
        (m,) = [m for m in v.matches if m.state is H.DEAD]
        assert m.since <= NOW - 30  # the earliest witness: when it probably died
        assert m.evidence  # the signals behind it are kept with the incident


def test_dead_outranks_failed_and_is_rechecked_when_deadafter_passes() -> None:
    xid = Signal("n1", "dcgm", SignalKind.XID, "x", 79.0, NOW - 5)
    p = policy(rules=(cp.XidRule("fatal", Severity.FAILED, frozenset({79})),), dead=ALL)
    v = evaluate("n1", [xid, ready("Unknown", NOW - 600), slurm("NOT_RESPONDING")], p, NOW)
    assert v.state is H.DEAD
    early = evaluate("n1", [ready("Unknown", NOW - 20), slurm("NOT_RESPONDING")], p, NOW)
    assert early.state is H.SUSPECT
    assert early.recheck_after == pytest.approx(40.0)


def test_a_policy_without_dead_node_handling_never_says_dead() -> None:
    v = evaluate("n1", [ready("Unknown", NOW - 6000), slurm("NOT_RESPONDING")], policy(), NOW)
    assert v.state is H.HEALTHY


# -- mass death -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("times", "back", "window", "most"), [
    ([], [], 60, 0), ([1.0], [], 60, 1), ([0.0, 10, 20, 100], [], 30, 3),
    ([0.0, 31, 62], [], 30, 1), ([5.0, 0, 3, 200, 201], [], 10, 3),
    # answered again after the first of a group went NotReady: out with it
    ([100.0], [150.0], 60, 2), ([100.0, 400], [150.0, 450], 60, 3),
    # answered again before any went NotReady (a repaired node back): an earlier fault
    ([100.0], [90.0], 60, 1),
    # nobody NotReady: no outage, whoever answered
    ([], [10.0, 20], 60, 0),
])
def test_outage(times: list[float], back: list[float], window: float, most: int) -> None:
    assert outage(times, back, window) == most


def _brute_outage(times: list[float], back: list[float], window: float) -> int:
    return max((sum(1 for u in times if t <= u <= t + window) +
                sum(1 for b in back if b >= t) for t in times), default=0)


@pytest.mark.parametrize("seed", range(50))
def test_outage_is_the_brute_force_count(seed: int) -> None:

    rnd = random.Random(seed)
    times = [rnd.uniform(0, 1000) for _ in range(rnd.randrange(0, 8))]
    back = [rnd.uniform(0, 1000) for _ in range(rnd.randrange(0, 8))]
    window = rnd.choice([1.0, 50.0, 300.0])
    assert outage(times, back, window) == _brute_outage(times, back, window)


def _fleet(down: dict[str, float], domains: dict[str, str],
           back: dict[str, float] | None = None) -> list[NodeView]:
    """NotReady since ``down``; the rest Ready, since ``back`` (answered again then) or for a
    day."""
    out = []
    for name, dom in domains.items():
        n = node(name, **{DOMAIN_LABEL: dom})
        if name in down:
            cond = NodeCondition("Ready", "Unknown", last_transition=down[name])
        else:
            cond = NodeCondition("Ready", "True",
                                 last_transition=(back or {}).get(name, T0 - 86400))
        out.append(replace(n, conditions=(cond,)))
    return out


TEN = {f"n{i}": ("a" if i <= 4 else "b") for i in range(1, 11)}  # 4 in a, 6 in b
MD = cp.MassDeath(window=300, max_share=cp.Quantity(30, percent=True),
                  max_share_per_domain=cp.Quantity(25, percent=True), domains=(DOMAIN_LABEL,))

# (case, NotReady nodes with since, the node asking, tripped where[, Ready again since])
MASS: list[tuple[Any, ...]] = [
    ("one dead node: a node fault", {"n1": T0 - 10}, "n1", None),
    ("half of domain a at once: tripped", {"n1": T0 - 10, "n2": T0 - 20}, "n1",
     f"{DOMAIN_LABEL}=a"),
    ("the other domain asks: its own domain is fine", {"n1": T0 - 10, "n2": T0 - 20,
                                                       "n5": T0 - 5}, "n5", None),
    ("two of a, hours apart: two node faults", {"n1": T0 - 10, "n2": T0 - 7200}, "n1", None),
    ("four of ten across domains at once: the scope", {"n1": T0 - 1, "n5": T0 - 2,
                                                       "n6": T0 - 3, "n7": T0 - 4}, "n6", ""),
    # an outage healing node by node is one event: its last node is not a node fault
    ("half of a, one answered again a minute ago: still tripped", {"n1": T0 - 600}, "n1",
     f"{DOMAIN_LABEL}=a", {"n2": T0 - 60}),
    ("half of a, one answered again over a window ago: a node fault", {"n1": T0 - 900}, "n1",
     None, {"n2": T0 - 400}),
    ("one answered again in the other domain: domain a is fine", {"n1": T0 - 600}, "n1",
     None, {"n5": T0 - 60}),
    ("nobody NotReady, some answered again: nothing to trip", {}, "n1", None,
     {"n1": T0 - 10, "n2": T0 - 20, "n3": T0 - 30}),
    # a node of a answered again (repaired) a minute before another of a died: two faults
    ("one of a back before another died: a node fault", {"n1": T0 - 60}, "n1", None,
     {"n2": T0 - 120}),
]


@pytest.mark.parametrize("case", [c[1:] for c in MASS], ids=[c[0] for c in MASS])
def test_mass_death(case: tuple[Any, ...]) -> None:
    down, asking, where = case[:3]
    back = case[3] if len(case) > 3 else {}
    p = policy(dead=replace(DEAD_ON, mass_death=MD))
    ps = policies(p)
    nodes = _fleet(down, TEN, back)
    scan = view(ps, nodes=nodes)
    index = FleetIndex(ps)
    for n in nodes:
        index.set_node(n)
    for v in (scan, index.view()):  # the incremental index and a scan agree
        found = mass_death(MD, v.facts(), p, v.nodes[asking], T0)
        assert (found.domain if found is not None else None) == where
        if found is not None:
            assert isinstance(found, MassDeathFinding)
            assert found.count > found.limit
        adm = check_admission(asking, (), p, v, T0, dead=True)
        assert adm.allowed is (where is None)
        if where is not None:
            assert adm.block is not None
            assert adm.block.guardrail == "mass-death"
            assert "suspect the control plane or the network, not the nodes" in \
                adm.block.message


def test_a_dead_node_ignores_the_capacity_limits_a_sick_one_must_respect() -> None:
    tight = cp.Guardrails(max_concurrent=0, max_unavailable=cp.Quantity(0),
                          failure_domains=(cp.FailureDomain(DOMAIN_LABEL, 0),))
    p = policy(guardrails=tight, dead=DEAD_ON)
    v = view(policies(p), nodes=_fleet({"n1": T0 - 10}, TEN))
    assert not check_admission("n1", (), p, v, T0).allowed
    assert check_admission("n1", (), p, v, T0, dead=True).allowed
