"""FleetIndex: kept incrementally, it answers every guardrail exactly as a full scan would.

The oracle is the scan-based implementation the index replaced, copied here verbatim (modulo
names), extended with Slurm's causes (issue 12), over a plain view of the fleet
(:class:`OracleView`): random sequences of node, record and Slurm changes, applied one at a
time to an index, must give the same admissions and usage as the oracle over the same fleet
built from scratch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer.core import rules as cp
from healer.core.budget import (
    Admission,
    BreakerStatus,
    GuardrailUsage,
    SlurmView,
    breaker_status,
    check_admission,
    population,
    scope_breaker,
    usage,
)
from healer.core.capacity import FleetIndex, open_remediation, past_incident
from healer.core.fleet import budget_view
from healer.core.machine import releases
from healer.core.model import (
    GpuRef,
    Guardrail,
    GuardrailBlock,
    HealthState,
    NodeCondition,
    NodeRecord,
    NodeView,
    OpenRemediation,
    PastIncident,
    StepRecord,
)
from healer.core.nodesets import NodeSetRules, NodeSets
from healer.core.phases import Phase
from healer.core.timefmt import rfc3339
from healer.core.unavailability import CAUSES
from tests.builders import T0, done_step, open_step, record

# ---------------------------------------------------------------------------------------------
# The oracle: the guardrails as they were before the index (a scan per question)


@dataclass(frozen=True)
class OracleView:
    """What the guardrails saw before the index: the fleet in plain maps."""

    policies: cp.PolicySet
    nodes: Mapping[str, NodeView]
    open: Mapping[str, OpenRemediation]
    incidents: tuple[PastIncident, ...]
    paused: bool
    paused_nodes: frozenset[str]
    slurm: Mapping[str, str]
    slurm_view: SlurmView

    def is_paused(self, node: str) -> bool:
        return self.paused or self.policies.fleet.paused or node in self.paused_nodes


def o_threshold(cfg: cp.Breaker, pop: int) -> int:
    if cfg.threshold.percent:
        return max(math.ceil(pop * cfg.threshold.value / 100.0), 2)
    return max(int(cfg.threshold.value), 2)


def o_breaker(cfg: cp.Breaker, incidents: Iterable[PastIncident], pop: int,
              now: float) -> BreakerStatus:
    threshold = o_threshold(cfg, pop)
    times = sorted((i.opened_at, i.node) for i in incidents if i.opened_at <= now)

    def distinct_in_window(end: float) -> int:
        return len({n for t, n in times if end - cfg.window < t <= end})

    last_trip: float | None = None
    for t, _ in times:
        if now - t >= cfg.window + cfg.cooldown:
            continue
        if distinct_in_window(t) >= threshold:
            last_trip = t
    count = distinct_in_window(now)
    if last_trip is not None and now < last_trip + cfg.cooldown:
        return BreakerStatus(True, count, threshold, last_trip + cfg.cooldown)
    return BreakerStatus(False, count, threshold, None)


def o_selects(view: OracleView, pol: cp.Policy | NodeSetRules | None, n: NodeView) -> bool:
    if pol is None:
        return view.policies.for_node(n) is not None
    if isinstance(pol, NodeSetRules):
        first = next((x for x in sorted(view.policies.nodesets.items, key=lambda x: x.name)
                      if x.selector.matches(n.labels)), None)
        return first is not None and first.name == pol.name \
            and view.policies.for_node(n) is not None
    return pol.applies_to(n)


def o_tagged(view: OracleView, pol: cp.Policy | NodeSetRules | None, node: str,
             policy: str) -> bool:
    """Does a remediation or incident of ``node`` (under ``policy``) count in ``pol``?"""
    if pol is None:
        return True
    if isinstance(pol, NodeSetRules):
        n = view.nodes.get(node)
        first = None if n is None else next(
            (x for x in sorted(view.policies.nodesets.items, key=lambda x: x.name)
             if x.selector.matches(n.labels)), None)
        return first is not None and first.name == pol.name
    return policy == pol.name


def o_population(view: OracleView, pol: cp.Policy | NodeSetRules | None) -> list[NodeView]:
    spare_sel = view.policies.fleet.spare_selector
    in_flight = {r.spare for r in view.open.values() if r.spare and r.phase is not Phase.REPAIR}
    out: list[NodeView] = []
    for n in view.nodes.values():
        if spare_sel.match_labels and spare_sel.matches(n.labels):
            continue
        if n.name in in_flight:  # a claimed spare not yet serving: its bad node counts
            continue
        if not o_selects(view, pol, n):
            continue
        rec = view.open.get(n.name)
        if rec is not None and rec.spare and rec.phase is Phase.REPAIR:
            continue
        out.append(n)
    return out


def o_unavailable(view: OracleView, nodes: Iterable[NodeView]) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in nodes:
        rec = view.open.get(n.name)
        if rec is not None and (rec.active or rec.out_of_service):
            out[n.name] = "healer"
        elif n.unschedulable:
            out[n.name] = "cordoned"
        elif not n.ready:
            out[n.name] = "not-ready"
        elif view.slurm.get(n.name):
            out[n.name] = view.slurm[n.name]
    return out


def o_causes(down: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in down.values():
        out[c] = out.get(c, 0) + 1
    return out


def o_replaced(view: OracleView, pol: cp.Policy | NodeSetRules | None) -> int:
    spare_sel = view.policies.fleet.spare_selector
    in_flight = {r.spare for r in view.open.values() if r.spare and r.phase is not Phase.REPAIR}
    n = 0
    for v in view.nodes.values():
        rec = view.open.get(v.name)
        if (spare_sel.match_labels and spare_sel.matches(v.labels)) or v.name in in_flight:
            continue
        if o_selects(view, pol, v) and rec is not None and rec.spare \
                and rec.phase is Phase.REPAIR:
            n += 1
    return n


def o_check(node: str, serials: tuple[str, ...], policy: cp.Policy, view: OracleView,
            now: float, incident: str = "", opened_at: float | None = None) -> Admission:
    if view.is_paused(node):
        return Admission(False, GuardrailBlock(Guardrail.PAUSE, "remediation is paused"), False,
                         60.0)
    budget = policy.guardrails.retry_budget or view.policies.fleet.guardrails.retry_budget
    if budget is not None:
        past = [i for i in view.incidents
                if i.id != incident and now - budget.window <= i.opened_at <= now]
        on_node = sum(1 for i in past if i.node == node)
        if on_node >= budget.per_node:
            return Admission(False, GuardrailBlock(
                Guardrail.RETRY_BUDGET_NODE,
                f"node {node} had {on_node} incidents in the last "
                f"{budget.window / 86400:g}d (budget {budget.per_node})",
                on_node, budget.per_node), escalate=True)
        for serial in serials:
            if not serial:
                continue
            n = sum(1 for i in past if serial in i.serials)
            if n >= budget.per_gpu_serial:
                return Admission(False, GuardrailBlock(
                    Guardrail.RETRY_BUDGET_GPU,
                    f"GPU serial {serial} failed {n} times in the last "
                    f"{budget.window / 86400:g}d (budget {budget.per_gpu_serial})",
                    n, budget.per_gpu_serial), escalate=True)
    scopes: list[tuple[str, cp.Guardrails, cp.Policy | NodeSetRules | None]] = [
        (f"policy {policy.name}", policy.guardrails, policy)]
    scopes += [(f"NodeSet {ns.name}", ns.guardrails, ns) for ns in view.policies.nodesets.items
               if node in view.nodes and o_tagged(view, ns, node, "")]
    scopes.append(("fleet", view.policies.fleet.guardrails, None))
    for scope, g, pol in scopes:
        members = o_population(view, pol)
        if g.breaker is not None:
            incidents = [i for i in view.incidents if o_tagged(view, pol, i.node, i.policy)]
            if opened_at is not None and all(i.id != incident for i in incidents):
                incidents.append(PastIncident(incident, node, opened_at, policy.name, serials))
            br = o_breaker(g.breaker, incidents, len(members), now)
            if br.tripped:
                until = br.until if br.until is not None else now
                return Admission(False, GuardrailBlock(
                    Guardrail.BREAKER,
                    f"{scope} breaker tripped: {br.count} nodes went bad within "
                    f"{g.breaker.window:g}s (threshold {br.threshold}); it closes at "
                    f"{rfc3339(until)} unless more fail", br.count, br.threshold),
                    recheck_after=max(until - now, 1.0))
        if g.max_concurrent is not None:
            active = sum(1 for r in view.open.values()
                         if r.node != node and r.active and o_tagged(view, pol, r.node, r.policy))
            if active + 1 > g.max_concurrent:
                return Admission(False, GuardrailBlock(
                    Guardrail.MAX_CONCURRENT,
                    f"{scope}: {active} remediations in flight, limit {g.max_concurrent}",
                    active, g.max_concurrent), recheck_after=30.0)
        if view.slurm_view == "unknown" and (g.max_unavailable is not None
                                             or g.failure_domains):
            return Admission(False, GuardrailBlock(
                Guardrail.SLURM_UNKNOWN,
                f"{scope}: Slurm's node states cannot be read, so its maxUnavailable and "
                "failure-domain limits cannot be checked; nothing is taken out until they "
                "can"), recheck_after=30.0)
        down = o_unavailable(view, members)
        if g.max_unavailable is not None:
            limit = g.max_unavailable.of(len(members))
            after = len(set(down) | {node})
            if after > limit:
                causes = o_causes(down)
                said = ", ".join(f"{causes[c]} {c}" for c in CAUSES if c in causes)
                return Admission(False, GuardrailBlock(
                    Guardrail.MAX_UNAVAILABLE,
                    f"{scope}: {len(down)} of {len(members)} nodes unavailable"
                    f"{f' ({said})' if said else ''}; taking {node} "
                    f"makes {after}, limit {g.max_unavailable} = {limit}", after, limit),
                    recheck_after=30.0)
        target = view.nodes.get(node)
        for fd in g.failure_domains:
            value = target.labels.get(fd.key) if target is not None else None
            if value is None:
                continue
            same = [m for m in members if m.labels.get(fd.key) == value]
            after = len(set(o_unavailable(view, same)) | {node})
            if after > fd.max_unavailable:
                return Admission(False, GuardrailBlock(
                    Guardrail.FAILURE_DOMAIN,
                    f"{scope}: {fd.key}={value} would have {after} nodes unavailable, "
                    f"limit {fd.max_unavailable}", after, fd.max_unavailable),
                    recheck_after=30.0)
    return Admission(True)


def o_usage(view: OracleView, now: float) -> list[GuardrailUsage]:
    out: list[GuardrailUsage] = []
    scopes: list[tuple[str, cp.Guardrails, cp.Policy | NodeSetRules | None]] = [
        ("fleet", view.policies.fleet.guardrails, None)]
    scopes += [(p.name, p.guardrails, p) for p in view.policies.policies]
    scopes += [(f"nodeset:{ns.name}", ns.guardrails, ns)
               for ns in sorted(view.policies.nodesets.items, key=lambda x: x.name)]
    for scope, g, pol in scopes:
        members = o_population(view, pol)
        active = sum(1 for r in view.open.values()
                     if r.active and o_tagged(view, pol, r.node, r.policy))
        br = None
        if g.breaker is not None:
            incidents = [i for i in view.incidents if o_tagged(view, pol, i.node, i.policy)]
            br = o_breaker(g.breaker, incidents, len(members), now)
        down = o_unavailable(view, members)
        out.append(GuardrailUsage(
            scope, len(members), len(down),
            g.max_unavailable.of(len(members)) if g.max_unavailable else None,
            active, g.max_concurrent, br, o_causes(down), o_replaced(view, pol),
            view.slurm_view))
    return out


# ---------------------------------------------------------------------------------------------
# The model: the fleet as plain maps, changed the way the index is told


@dataclass
class Fleet:
    policies: cp.PolicySet
    nodes: dict[str, NodeView] = field(default_factory=dict)
    open: dict[str, NodeRecord] = field(default_factory=dict)  # node -> open record
    history: dict[str, NodeRecord] = field(default_factory=dict)  # incident id -> record
    slurm: dict[str, str] = field(default_factory=dict)  # node -> Slurm cause
    slurm_view: SlurmView = SlurmView.OFF

    def apply(self, index: FleetIndex, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "close":  # the node's open record ends (or a fresh closed one arrives)
            held = self.open.get(op[1].node)
            if held is not None:
                op = ("record", replace(held, phase=op[1].phase, ledger=op[1].ledger,
                                        verdict=HealthState.HEALTHY))
            else:
                op = ("record", op[1])
            kind = "record"
        elif kind == "stale":  # a closed record of another incident on a node with an open one
            held = self.open.get(op[1].node)
            if held is not None:
                other = replace(op[1].incident, id=held.incident.id + "-old")
                op = ("record", replace(op[1], incident=other))
            else:
                op = ("record", op[1])
            kind = "record"
        if kind == "node":
            self.nodes[op[1].name] = op[1]
            index.set_node(op[1])
        elif kind == "gone":
            self.nodes.pop(op[1], None)
            index.remove_node(op[1])
        elif kind == "record":
            rec: NodeRecord = op[1]
            if rec.phase is Phase.SUSPECT:
                self.open.pop(rec.node, None)
                self.history.pop(rec.incident.id, None)
            else:
                self.history[rec.incident.id] = rec
                held = self.open.get(rec.node)
                if not releases(rec):
                    self.open[rec.node] = rec
                elif held is None or held.incident.id == rec.incident.id:
                    self.open.pop(rec.node, None)
            index.set_record(rec)
        elif kind == "drop":
            self.open.pop(op[1], None)
            index.drop_record(op[1])
        elif kind == "forget":
            self.history.pop(op[1], None)
            index.forget_incident(op[1])
        elif kind == "policies":
            self.policies = op[1]
            index.set_policies(op[1])
        elif kind == "slurm":  # the Slurm feed saw a change on a node
            if op[2]:
                self.slurm[op[1]] = op[2]
            else:
                self.slurm.pop(op[1], None)
            index.set_slurm(op[1], op[2])
        elif kind == "slurm-view":
            self.slurm_view = SlurmView(op[1])
            index.set_slurm_view(self.slurm_view)

    def oracle(self, paused: bool) -> OracleView:
        paused_nodes = frozenset(n for n, v in self.nodes.items()
                                 if v.annotations.get("healer.io/paused", "").lower() == "true")
        return OracleView(self.policies, dict(self.nodes),
                          {n: open_remediation(r) for n, r in self.open.items()},
                          tuple(past_incident(r) for r in self.history.values()),
                          paused, paused_nodes, slurm=dict(self.slurm),
                          slurm_view=self.slurm_view)


NAMES = [f"n{i}" for i in range(8)]
ZONES = ["z1", "z2"]
SERIALS = ["S1", "S2", "S3"]
IDS = [f"{n}-{k}" for n in NAMES for k in range(3)]
TIMES = [T0 + 60.0 * k for k in range(-40, 6)]
NOWS = [T0, T0 + 300.0, T0 - 700.0, T0 + 2500.0]

quantities = st.one_of(st.builds(cp.Quantity, st.integers(0, 5).map(float)),
                       st.builds(cp.Quantity, st.sampled_from([0.0, 10.0, 34.0, 50.0, 100.0]),
                                 st.just(True)))
breakers = st.builds(cp.Breaker, st.sampled_from([60.0, 300.0, 600.0]), quantities,
                     st.sampled_from([0.0, 120.0, 1800.0]))
budgets = st.builds(cp.RetryBudget, st.integers(1, 3), st.integers(1, 3),
                    st.sampled_from([600.0, 3600.0, 86400.0]))
domains = st.lists(st.builds(cp.FailureDomain, st.sampled_from(["zone", "pool"]),
                             st.integers(0, 2)), max_size=2).map(tuple)
guardrails = st.builds(cp.Guardrails, st.none() | st.integers(0, 4),
                       st.one_of(st.none(), st.none(), quantities), domains,
                       st.none() | breakers, st.none() | budgets)
SELECTORS = [
    cp.LabelSelector({"pool": "a"}),
    cp.LabelSelector({"gpu": "true"}),
    cp.LabelSelector({}, (("pool", "In", frozenset({"a", "b"})), ("zone", "NotIn",
                                                                   frozenset({"z2"})))),
    cp.LabelSelector({}, (("gpu", "Exists", frozenset()),)),
]
SPARE_SELECTORS = [cp.LabelSelector({"healer.io/role": "spare"}),
                   cp.LabelSelector({}, (("healer.io/role", "Exists", frozenset()),))]


@st.composite
def policy_sets(draw: st.DrawFn) -> cp.PolicySet:
    n = draw(st.integers(1, 3))
    sels = draw(st.lists(st.sampled_from(SELECTORS), min_size=n, max_size=n))
    pols = tuple(cp.Policy(f"p{i}", sel, (), guardrails=draw(guardrails))
                 for i, sel in enumerate(sels))
    fleet = cp.FleetRules(draw(guardrails), draw(st.sampled_from(SPARE_SELECTORS)),
                               draw(st.integers(0, 19)) == 0)
    k = draw(st.integers(0, 2))  # NodeSets: own guardrails over the nodes they select
    nodesets = NodeSets(tuple(
        NodeSetRules(f"ns{i}", draw(st.sampled_from(SELECTORS)), f"c{i % 2}",
                     guardrails=draw(guardrails)) for i in draw(st.permutations(range(k)))))
    return cp.PolicySet(pols, fleet, nodesets=nodesets)


@st.composite
def node_views(draw: st.DrawFn) -> NodeView:
    labels: dict[str, str] = {}
    for key, values in (("pool", ["a", "b"]), ("zone", ZONES), ("gpu", ["true"]),
                        ("healer.io/role", ["spare"])):
        if draw(st.booleans()):
            labels[key] = draw(st.sampled_from(values))
    ann = {"healer.io/paused": draw(st.sampled_from(["true", "TRUE", "false"]))} \
        if draw(st.integers(0, 4)) == 0 else {}
    ready = draw(st.integers(0, 4)) > 0
    return NodeView(draw(st.sampled_from(NAMES)), labels, ann, draw(st.integers(0, 4)) == 0,
                    (), (NodeCondition("Ready", "True" if ready else "False"),))


LEDGERS: list[tuple[StepRecord, ...]] = [
    (), (done_step("drain"),), (done_step("cordon"),),
    (done_step("drain"), done_step("undo-drain"), done_step("uncordon")),
    (open_step("uncordon"),)]


CLOSED = [Phase.DONE, Phase.ESCALATED, Phase.CANCELLED]
PHASES = [Phase.DRAINING, Phase.DONE, Phase.REPAIR, Phase.ESCALATED, Phase.CANCELLED,
          Phase.SUSPECT, *(p for p in Phase if p not in (
              Phase.DRAINING, Phase.DONE, Phase.REPAIR, Phase.ESCALATED, Phase.CANCELLED,
              Phase.SUSPECT))]


@st.composite
def records(draw: st.DrawFn, closing: bool = False) -> NodeRecord:
    nodename = draw(st.sampled_from(NAMES))
    at = draw(st.sampled_from(TIMES))
    phase = draw(st.sampled_from(CLOSED if closing else PHASES))
    base = record(phase, nodename=nodename, at=at, ledger=draw(st.sampled_from(LEDGERS)),
                  policy_name=draw(st.sampled_from(["p0", "p1", "p2", "gone"])),
                  spare=draw(st.sampled_from(["", "", "s9", "n7"])), repaired=draw(st.booleans()),
                  verdict=draw(st.sampled_from([HealthState.HEALTHY, HealthState.FAILED])))
    serials = draw(st.lists(st.sampled_from([*SERIALS, ""]), max_size=2))
    gpus = tuple(GpuRef(i, f"GPU-{i}", s) for i, s in enumerate(serials))
    incident_id = f"{nodename}-{draw(st.integers(0, 2))}" if draw(st.integers(0, 3)) \
        else draw(st.sampled_from(IDS))  # mostly the node's own incidents, sometimes a move
    return replace(base, incident=replace(base.incident, id=incident_id, gpus=gpus))


ops = st.one_of(
    st.tuples(st.just("node"), node_views()),
    st.tuples(st.just("record"), records()),
    st.tuples(st.just("node"), node_views()),
    st.tuples(st.just("record"), records()),
    st.tuples(st.just("node"), node_views()),
    st.tuples(st.just("record"), records(closing=True)),
    st.tuples(st.just("close"), records(closing=True)),
    st.tuples(st.just("close"), records(closing=True)),
    st.tuples(st.just("stale"), records(closing=True)),
    st.tuples(st.just("gone"), st.sampled_from(NAMES)),
    st.tuples(st.just("drop"), st.sampled_from(NAMES)),
    st.tuples(st.just("forget"), st.sampled_from(IDS)),
    st.tuples(st.just("policies"), policy_sets()),
    st.tuples(st.just("slurm"), st.sampled_from(NAMES),
              st.sampled_from(["", "", "slurm-drain", "slurm-down", "slurm-not-responding"])),
    st.tuples(st.just("slurm"), st.sampled_from(NAMES), st.sampled_from(["", "slurm-drain"])),
    st.tuples(st.just("slurm-view"), st.sampled_from(["off", "ok", "ok", "unknown"])),
)


def assert_same(fleet: Fleet, index: FleetIndex, full: bool) -> None:
    for paused in (False, True) if full else (False,):
        oracle = fleet.oracle(paused)
        if paused:
            assert check_admission("n1", (), fleet.policies.policies[0], index.view(paused=True),
                                   T0) == o_check("n1", (), fleet.policies.policies[0], oracle, T0)
            continue
        views = [index.view(paused=paused)]
        if full:  # the same fleet from scratch
            views.append(budget_view(fleet.policies, fleet.nodes, fleet.open.values(),
                                     fleet.history.values(), paused=paused,
                                     paused_nodes=frozenset(oracle.paused_nodes),
                                     slurm=fleet.slurm, slurm_view=fleet.slurm_view))
        for now in NOWS if full else NOWS[:1]:
            want_usage = o_usage(oracle, now)
            for v in views:
                assert usage(v, now) == want_usage
            stranger = cp.Policy("p0", cp.LabelSelector({"zone": "z1"}), (),
                                 guardrails=cp.Guardrails(max_unavailable=cp.Quantity(1)))
            for pol in (*fleet.policies.policies, stranger):
                want_pop = [n.name for n in o_population(oracle, pol)]
                assert [n.name for n in population(views[0], pol)] == want_pop
                for name in [*NAMES, "unknown"] if full else NAMES[:3]:
                    for serials, incident, opened in (((), "", None), (("S1", "S2"), "n1-0", now),
                                                      (("S3", ""), "new", now - 30.0)):
                        want = o_check(name, serials, pol, oracle, now, incident, opened)
                        for v in views:
                            got = check_admission(name, serials, pol, v, now, incident, opened)
                            assert got == want, (name, pol.name, now, got, want)
    v = index.view()
    assert dict(v.nodes) == fleet.nodes
    assert dict(v.open) == {n: open_remediation(r) for n, r in fleet.open.items()}
    assert sorted(v.incidents, key=lambda i: i.id) == sorted(
        (past_incident(r) for r in fleet.history.values()), key=lambda i: i.id)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_sets(), st.lists(ops, min_size=4, max_size=40))
def test_incremental_index_matches_a_full_scan(ps: cp.PolicySet,
                                               steps: list[tuple[Any, ...]]) -> None:
    fleet, index = Fleet(ps), FleetIndex(ps)
    for op in steps:
        fleet.apply(index, op)
        assert_same(fleet, index, full=False)
    assert_same(fleet, index, full=True)


@settings(max_examples=300, deadline=None)
@given(st.builds(cp.Breaker, st.sampled_from([0.0, 30.0, 45.0, 60.0, 300.0, 600.0, 1e9]),
                 quantities, st.sampled_from([-100.0, 0.0, 30.0, 120.0, 1800.0])),
       st.integers(0, 30),
       st.lists(st.tuples(st.integers(-90, 10), st.sampled_from(NAMES[:4]),
                          st.sampled_from(["p0", "p1"])), max_size=25),
       st.integers(-60, 40), st.none() | st.tuples(st.integers(-60, 10), st.booleans()))
def test_breaker_from_the_index_matches_the_quadratic_scan(
        cfg: cp.Breaker, pop: int, raw: list[tuple[int, str, str]], at: int,
        asking: tuple[int, bool] | None) -> None:
    """Incidents on a 30 s grid around the window's edges, the asking incident or not."""
    incidents = [PastIncident(f"i{k}", n, T0 + 30.0 * t, p) for k, (t, n, p) in enumerate(raw)]
    index = FleetIndex(cp.PolicySet((cp.Policy("p0", cp.LabelSelector(), ()),)))
    for inc in incidents:
        index.add_incident(inc)
    now = T0 + 30.0 * at
    assert breaker_status(cfg, incidents, pop, now) == o_breaker(cfg, incidents, pop, now)
    pol = index.policies.policies[0]
    for scope in (None, pol):
        mine = [i for i in incidents if scope is None or i.policy == "p0"]
        extra = None
        if asking is not None:
            extra = (T0 + 30.0 * asking[0], "n7" if asking[1] else "n0")
            mine.append(PastIncident("new", extra[1], extra[0], "p0"))
        assert scope_breaker(cfg, index, scope, pop, now, extra) == o_breaker(cfg, mine, pop, now)


# ---------------------------------------------------------------------------------------------
# Work per decision does not grow with the fleet (counted, not timed)


@dataclass
class Counts:
    matches: int = 0
    ready: int = 0
    breaker_entries: int = 0
    retry_entries: int = 0


FLEET_POLICIES = cp.PolicySet((
    cp.Policy("a", cp.LabelSelector({"pool": "a"}), (), guardrails=cp.Guardrails(
        max_concurrent=50, max_unavailable=cp.Quantity(50, True),
        failure_domains=(cp.FailureDomain("zone", 50),),
        breaker=cp.Breaker(600, cp.Quantity(30, True), 1800), retry_budget=cp.RetryBudget())),
    cp.Policy("b", cp.LabelSelector({}, (("pool", "In", frozenset({"b"})),)), ())),
    cp.FleetRules(cp.Guardrails(max_unavailable=cp.Quantity(50, True),
                                     breaker=cp.Breaker(600, cp.Quantity(30, True), 1800))))


def counted(monkeypatch: pytest.MonkeyPatch) -> Counts:
    counts = Counts()
    matches, ready = cp.LabelSelector.matches, NodeView.ready
    breaker_times = FleetIndex.breaker_times
    on_node = FleetIndex.incidents_on_node
    with_serial = FleetIndex.incidents_with_serial

    def count_matches(self: cp.LabelSelector, labels: Any) -> bool:
        counts.matches += 1
        return matches(self, labels)

    def count_ready(self: NodeView) -> bool:
        counts.ready += 1
        return bool(ready.__get__(self))

    def count_breaker(self: FleetIndex, *a: Any) -> Any:
        out = breaker_times(self, *a)
        counts.breaker_entries += len(out)
        return out

    def count_on_node(self: FleetIndex, node: str) -> Any:
        out = list(on_node(self, node))
        counts.retry_entries += len(out)
        return out

    def count_with_serial(self: FleetIndex, serial: str) -> Any:
        out = list(with_serial(self, serial))
        counts.retry_entries += len(out)
        return out

    monkeypatch.setattr(cp.LabelSelector, "matches", count_matches)
    monkeypatch.setattr(FleetIndex, "incidents_with_serial", count_with_serial)
    monkeypatch.setattr(NodeView, "ready", property(count_ready))
    monkeypatch.setattr(FleetIndex, "breaker_times", count_breaker)
    monkeypatch.setattr(FleetIndex, "incidents_on_node", count_on_node)
    return counts


def on_gpu(rec: NodeRecord, serial: str) -> NodeRecord:
    return replace(rec, incident=replace(rec.incident, gpus=(GpuRef(0, "GPU-0", serial),)))


def fleet_of(size: int) -> FleetIndex:
    index = FleetIndex(FLEET_POLICIES)
    for i in range(size):
        index.set_node(NodeView(f"n{i}", {"pool": "ab"[i % 2], "zone": f"z{i % 20}"},
                                unschedulable=i % 97 == 0))
    for i in range(0, size, 10):  # history grows with the fleet, but long ago
        index.set_record(on_gpu(record(Phase.DONE, nodename=f"n{i}", at=T0 - 86400 - i,
                                       policy_name="ab"[i % 2]), f"SER-{i}"))
    for i in (3, 5, 7):  # the same few recent incidents at every size
        index.set_record(on_gpu(record(Phase.DRAINING, nodename=f"n{i}", at=T0 - 60 * i,
                                       policy_name="a"), "S1" if i == 3 else f"R{i}"))
    return index


@pytest.mark.parametrize("size", [100, 10_000])
def test_an_admission_does_constant_work_whatever_the_fleet_size(
        size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    index = fleet_of(size)
    policy_a = FLEET_POLICIES.policies[0]
    counts = counted(monkeypatch)
    for node in ("n1", "n11", "n51"):
        a = check_admission(node, ("S1",), policy_a, index.view(), T0, "new", T0)
        assert a.allowed, a
    usage(index.view(), T0)
    assert counts == Counts(matches=0, ready=0, breaker_entries=3 * 2 * 3 + 3 * 2,
                            retry_entries=3)
    # a node's change costs one match per selector, a record's none
    index.set_node(NodeView("n1", {"pool": "a", "zone": "z1"}))  # relabelled
    index.set_record(record(Phase.CORDONED, nodename="n9", policy_name="a"))
    assert counts.matches == len(FLEET_POLICIES.policies) + 1  # + the spare selector


# ---------------------------------------------------------------------------------------------
# Slurm's view, fed as changes (issue 12)


def test_slurm_changes_reach_every_count_of_the_index() -> None:
    limits = cp.Guardrails(max_unavailable=cp.Quantity(1),
                           failure_domains=(cp.FailureDomain("zone", 1),))
    ps = cp.PolicySet((cp.Policy("p0", cp.LabelSelector({"gpu": "true"}), (),
                                 guardrails=limits),))
    index = FleetIndex(ps)
    index.set_slurm("n2", "slurm-down")  # Slurm knows it before Kubernetes does
    for name, zone in (("n1", "z1"), ("n2", "z1"), ("n3", "z2")):
        index.set_node(NodeView(name, {"gpu": "true", "zone": zone}))
    pol = ps.policies[0]
    assert (index.unavailable(pol), index.cause(pol, "n2")) == (1, "slurm-down")
    assert index.domain_unavailable(pol, "zone", "z1") == 1
    assert dict(index.causes(None)) == {"slurm-down": 1}
    index.set_slurm("n2", "slurm-drain")  # another cause: still one node
    assert dict(index.causes(pol)) == {"slurm-drain": 1}
    index.set_node(NodeView("n2", {"gpu": "true", "zone": "z1"}, unschedulable=True))
    assert dict(index.causes(pol)) == {"cordoned": 1}  # Kubernetes' reason is named first
    index.set_node(NodeView("n2", {"gpu": "true", "zone": "z1"}))
    index.set_slurm("n2", "")
    assert (index.unavailable(pol), dict(index.causes(pol))) == (0, {})
    assert index.domain_unavailable(pol, "zone", "z1") == 0
    assert check_admission("n1", (), pol, index.view(), T0).allowed
    index.set_slurm("n3", "slurm-not-responding")
    index.set_policies(ps)  # a reload keeps Slurm's view
    assert index.cause(pol, "n3") == "slurm-not-responding"
    block = check_admission("n1", (), pol, index.view(), T0).block
    assert block is not None
    assert "(1 slurm-not-responding)" in block.message
    index.set_slurm_view(SlurmView.UNKNOWN)
    block = check_admission("n1", (), pol, index.view(), T0).block
    assert block is not None
    assert block.guardrail == "slurm-unknown"
    with pytest.raises(ValueError, match="maybe"):
        SlurmView("maybe")


def test_a_new_leader_keeps_slurms_view() -> None:
    from healer.core.engine import Engine

    engine = Engine(FLEET_POLICIES)
    engine.set_node(NodeView("n1", {"pool": "a"}))
    engine.fleet.set_slurm("n1", "slurm-drain")
    engine.fleet.set_slurm_view(SlurmView.OK)
    engine.load([record(Phase.DRAINING, nodename="n2", policy_name="a")], keep_closed_since=0)
    assert engine.fleet.slurm == {"n1": "slurm-drain"}
    assert engine.fleet.slurm_view == "ok"
    assert engine.fleet.cause(None, "n1") == "slurm-drain"


@pytest.mark.parametrize("size", [100, 10_000])
def test_a_slurm_change_does_constant_work_whatever_the_fleet_size(
        size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    index = fleet_of(size)
    counts = counted(monkeypatch)
    for i in (1, 11, 51):
        index.set_slurm(f"n{i}", "slurm-drain")
        index.set_slurm(f"n{i}", "slurm-drain")  # no change: no work
        index.set_slurm(f"n{i}", "")
    # each real change re-places one node (one readiness read), the repeat does nothing, and
    # no selector is matched again: the same work at 100 and at 10,000 nodes
    assert counts == Counts(ready=6)
