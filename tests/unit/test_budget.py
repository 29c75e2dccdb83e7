"""Guardrails: each limit, with the numbers it reports, and the breaker over time; and the
fleet index behind the views, told of each kind of change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from healer.core import rules as cp
from healer.core.budget import (
    BudgetView,
    SlurmView,
    breaker_status,
    breaker_threshold,
    check_admission,
    usage,
)
from healer.core.capacity import FleetIndex, open_remediation
from healer.core.fleet import budget_view
from healer.core.model import NodeRecord, NodeView, PastIncident
from healer.core.phases import Phase
from healer.core.unavailability import CAUSES, slurm_cause, unavailable_cause
from tests.builders import T0, done_step, node, policies, policy, record, view


def g(**kw: object) -> cp.Guardrails:
    return cp.Guardrails(**kw)  # type: ignore[arg-type]


def admit(pol: cp.Policy, v: object, n: str = "n1", serials: tuple[str, ...] = (),
          fleet: cp.FleetRules | None = None, now: float = T0) -> object:
    return check_admission(n, serials, pol, v, now)  # type: ignore[arg-type]


def test_max_concurrent_counts_active_remediations() -> None:
    pol = policy(guardrails=g(max_concurrent=2))
    v = view(policies(pol), records=[record(Phase.DRAINING, nodename="n2"),
                                     record(Phase.SWAPPING, nodename="n3")])
    a = check_admission("n1", (), pol, v, T0)
    assert not a.allowed
    assert a.block is not None
    assert a.block.guardrail == "max-concurrent"
    assert (a.block.current, a.block.limit) == (2, 2)
    assert "2 remediations in flight, limit 2" in a.block.message
    # a record in Repair (already replaced) or still pending admission does not count
    v2 = view(policies(pol), records=[record(Phase.REPAIR, nodename="n2", spare="s"),
                                      record(Phase.FAILED, nodename="n3")])
    assert check_admission("n1", (), pol, v2, T0).allowed


def test_max_unavailable_counts_nodes_cordoned_by_anyone() -> None:
    pol = policy(guardrails=g(max_unavailable=cp.Quantity(2)))
    nodes = [node("n1"), node("n2", unschedulable=True), node("n3", ready=False), node("n4")]
    a = check_admission("n1", (), pol, view(policies(pol), nodes), T0)
    assert not a.allowed
    assert a.block is not None
    assert a.block.guardrail == "max-unavailable"
    assert ("2 of 4 nodes unavailable (1 cordoned, 1 not-ready); taking n1 makes 3, limit 2"
            in a.block.message)
    # the node itself being already down does not add to the count
    nodes[0] = node("n1", ready=False)
    v = view(policies(policy(guardrails=g(max_unavailable=cp.Quantity(3)))), nodes)
    assert check_admission("n1", (), v.policies.policies[0], v, T0).allowed


@pytest.mark.parametrize(("pct", "population", "limit"), [
    (10, 10, 1), (10, 25, 2), (10, 5, 1), (0, 10, 0), (50, 3, 1), (100, 4, 4)])
def test_percentages_round_down_but_not_to_zero(pct: float, population: int, limit: int) -> None:
    assert cp.Quantity(pct, percent=True).of(population) == limit


def test_failure_domain_limit() -> None:
    key = "accelerator.topograph.run/domain"
    pol = policy(guardrails=g(failure_domains=(cp.FailureDomain(key, 1),)))
    nodes = [node("n1", **{key: "a"}), node("n2", **{key: "a"}, unschedulable=True),
             node("n3", **{key: "b"})]
    v = view(policies(pol), nodes)
    a = check_admission("n1", (), pol, v, T0)
    assert a.block is not None
    assert a.block.guardrail == "failure-domain"
    assert f"{key}=a would have 2 nodes unavailable, limit 1" in a.block.message
    assert check_admission("n3", (), pol, v, T0).allowed


def test_fleet_guardrails_apply_across_policies() -> None:
    p1, p2 = policy("a", labels={"pool": "a"}), policy("b", labels={"pool": "b"})
    fleet = cp.FleetRules(guardrails=g(max_concurrent=1))
    nodes = [node("n1", pool="a"), node("n2", pool="b")]
    v = view(policies(p1, p2, fleet=fleet), nodes,
             records=[record(Phase.DRAINING, nodename="n2", policy_name="b")])
    a = check_admission("n1", (), p1, v, T0)
    assert a.block is not None
    assert a.block.message.startswith("fleet:")


def test_retry_budget_per_node_and_per_serial_escalate() -> None:
    pol = policy(guardrails=g(retry_budget=cp.RetryBudget(per_node=2, per_gpu_serial=2,
                                                          window=86400)))
    past = [PastIncident("i1", "n1", T0 - 100, "p"), PastIncident("i2", "n1", T0 - 200, "p")]
    a = check_admission("n1", (), pol, view(policies(pol), incidents=past), T0)
    assert a.escalate
    assert a.block is not None
    assert a.block.guardrail == "retry-budget-node"
    old = [PastIncident("i1", "n1", T0 - 2 * 86400, "p"), PastIncident("i2", "n1", T0 - 200, "p")]
    assert check_admission("n1", (), pol, view(policies(pol), incidents=old), T0).allowed
    moved = [PastIncident("i1", "n5", T0 - 100, "p", ("SER",)),
             PastIncident("i2", "n6", T0 - 100, "p", ("SER",))]
    a = check_admission("n1", ("SER",), pol, view(policies(pol), incidents=moved), T0)
    assert a.escalate
    assert a.block is not None
    assert a.block.guardrail == "retry-budget-gpu"


def test_breaker_trips_holds_for_cooldown_and_closes_by_itself() -> None:
    br = cp.Breaker(window=600, threshold=cp.Quantity(3), cooldown=1800)
    inc = [PastIncident(f"i{k}", f"n{k}", T0 + 60 * k) for k in range(3)]
    assert not breaker_status(br, inc[:2], 10, T0 + 200).tripped
    st = breaker_status(br, inc, 10, T0 + 200)
    assert st.tripped
    assert st.until == T0 + 120 + 1800
    assert breaker_status(br, inc, 10, T0 + 120 + 1799).tripped
    assert not breaker_status(br, inc, 10, T0 + 120 + 1800).tripped
    # incidents spread wider than the window never trip it
    spread = [PastIncident(f"i{k}", f"n{k}", T0 + 700 * k) for k in range(10)]
    assert not breaker_status(br, spread, 10, T0 + 7000).tripped


def test_breaker_counts_distinct_nodes() -> None:
    br = cp.Breaker(window=600, threshold=cp.Quantity(2), cooldown=60)
    same = [PastIncident(f"i{k}", "n1", T0 + k) for k in range(5)]
    assert not breaker_status(br, same, 10, T0 + 10).tripped


def test_breaker_threshold_is_at_least_two_and_percent_rounds_up() -> None:
    assert breaker_threshold(cp.Breaker(threshold=cp.Quantity(10, True)), 4) == 2
    assert breaker_threshold(cp.Breaker(threshold=cp.Quantity(10, True)), 45) == 5
    assert breaker_threshold(cp.Breaker(threshold=cp.Quantity(1)), 45) == 2


def test_breaker_counts_the_asking_incident() -> None:
    pol = policy(guardrails=g(breaker=cp.Breaker(window=600, threshold=cp.Quantity(2),
                                                 cooldown=600)))
    v = view(policies(pol), incidents=[PastIncident("i0", "n2", T0 - 10, "p")])
    a = check_admission("n1", (), pol, v, T0, "i1", T0)
    assert a.block is not None
    assert a.block.guardrail == "breaker"
    assert a.recheck_after == pytest.approx(600)


def test_pause_blocks_admission() -> None:
    pol = policy()
    a = check_admission("n1", (), pol, view(policies(pol), paused=True), T0)
    assert a.block is not None
    assert a.block.guardrail == "pause"


def test_spares_are_outside_the_population() -> None:
    pol = policy(guardrails=g(max_unavailable=cp.Quantity(50, percent=True)))
    nodes = [node("n1"), node("n2", unschedulable=True),
             node("s1", **{"healer.io/role": "spare"}),
             node("s2", **{"healer.io/role": "spare"})]
    a = check_admission("n1", (), pol, view(policies(pol), nodes), T0)
    assert a.block is not None
    assert "1 of 2 nodes unavailable" in a.block.message


def test_usage_reports_every_scope() -> None:
    pol = policy(guardrails=g(max_concurrent=3, max_unavailable=cp.Quantity(2)))
    v = view(policies(pol), records=[record(Phase.DRAINING, nodename="n2")])
    rows = {u.scope: u for u in usage(v, T0)}
    assert set(rows) == {"fleet", "p"}
    assert rows["p"].active == 1
    assert rows["p"].max_concurrent == 3
    assert rows["p"].unavailable == 1


def test_budget_view_pauses_the_nodes_it_is_told_to() -> None:
    pol = policy()
    nodes = {n.name: n for n in (node("n1"), node("n2"))}
    v = budget_view(policies(pol), nodes, [], [], paused_nodes=frozenset({"n1"}))
    a = check_admission("n1", (), pol, v, T0)
    assert a.block is not None
    assert a.block.guardrail == "pause"
    assert check_admission("n2", (), pol, v, T0).allowed


# ---------------------------------------------------------------------------------------------
# What the index is told, case by case

LIMITS = cp.Guardrails(max_concurrent=1, max_unavailable=cp.Quantity(1),
                       retry_budget=cp.RetryBudget(per_node=1, per_gpu_serial=5, window=86400))
POLICY = cp.Policy("p", cp.LabelSelector({"gpu": "true"}), (), guardrails=LIMITS)


def gpu_node(name: str, **labels: str) -> NodeView:
    return NodeView(name, {"gpu": "true", **labels})


def small_index(*names: str) -> FleetIndex:
    index = FleetIndex(cp.PolicySet((POLICY,)))
    for name in names:
        index.set_node(gpu_node(name))
    return index


def blocked_by(index: FleetIndex, node: str = "n1", now: float = T0 + 10) -> str | None:
    a = check_admission(node, (), POLICY, index.view(), now)
    return a.block.guardrail if a.block is not None else None


def test_a_closed_record_frees_its_slot_but_stays_an_incident() -> None:
    index = small_index("n1", "n2")
    rec = record(Phase.DRAINING, nodename="n2", policy_name="p")
    index.set_record(rec)
    assert blocked_by(index) == "max-concurrent"
    index.set_record(replace(rec, phase=Phase.DONE))
    assert "n2" not in index.open
    assert blocked_by(index) is None
    assert blocked_by(index, "n2") == "retry-budget-node"  # its incident still counts
    index.forget_incident(rec.incident.id)
    assert blocked_by(index, "n2") is None


def test_a_closed_record_of_another_incident_leaves_the_open_one() -> None:
    index = small_index("n1", "n2")
    index.set_record(record(Phase.DRAINING, nodename="n2", at=T0))
    index.set_record(record(Phase.DONE, nodename="n2", at=T0 - 3600))  # replayed, older
    assert index.open["n2"].active
    index.drop_record("n2")
    assert "n2" not in index.open


def test_a_suspicion_is_neither_open_nor_an_incident() -> None:
    index = small_index("n1", "n2")
    rec = record(Phase.DRAINING, nodename="n2")
    index.set_record(rec)
    index.set_record(replace(rec, phase=Phase.SUSPECT))
    assert not index.open
    assert not index.view().incidents


def test_a_vanished_node_leaves_the_population_but_its_remediation_still_counts() -> None:
    index = small_index("n1", "n2", "n3")
    index.set_record(record(Phase.DRAINING, nodename="n2"))
    index.remove_node("n2")
    assert index.population(POLICY) == 2
    assert index.unavailable(POLICY) == 0
    assert index.active(POLICY) == 1
    assert blocked_by(index) == "max-concurrent"


def test_replaced_nodes_and_spares_are_outside_the_population() -> None:
    index = small_index("n1", "n2")
    index.set_node(gpu_node("s1", **{"healer.io/role": "spare"}))
    assert index.population(None) == 2
    index.set_record(record(Phase.REPAIR, nodename="n2", spare="s1"))
    assert set(index.members(POLICY)) == {"n1"}
    # a spare selector without matchLabels excludes nothing (as before)
    index.set_policies(cp.PolicySet((POLICY,), cp.FleetRules(spare_selector=cp.LabelSelector(
        {}, (("healer.io/role", "Exists", frozenset()),)))))
    assert set(index.members(None)) == {"n1", "s1"}


@pytest.mark.parametrize(("value", "paused"), [("true", True), ("True", True), ("TRUE", True),
                                                ("false", False), ("yes", False), ("", False)])
def test_the_pause_annotation(value: str, paused: bool) -> None:
    index = small_index("n2")
    index.set_node(NodeView("n1", {"gpu": "true"}, {"healer.io/paused": value}))
    assert index.view().is_paused("n1") is paused
    assert (blocked_by(index) == "pause") is paused
    index.set_node(gpu_node("n1"))
    assert not index.view().is_paused("n1")
    assert index.view(paused=True).is_paused("n2")


def test_prune_forgets_old_closed_incidents_only() -> None:
    index = small_index("n1", "n2")
    old_closed = record(Phase.DONE, nodename="n1", at=T0 - 10 * 86400)
    old_open = record(Phase.ESCALATED, nodename="n2", at=T0 - 10 * 86400)  # not released
    recent = record(Phase.DONE, nodename="n1", at=T0 - 60)
    for rec in (old_closed, old_open, recent):
        index.set_record(rec)
    assert index.prune(T0, 7 * 86400) == [old_closed.incident.id]
    assert {i.id for i in index.view().incidents} == {old_open.incident.id, recent.incident.id}


def test_a_policy_reload_rebuilds_the_populations() -> None:
    index = small_index("n1", "n2")
    index.set_node(NodeView("n3", {"cpu": "true"}))
    assert index.population(None) == 2
    wide = replace(POLICY, selector=cp.LabelSelector())
    index.set_policies(cp.PolicySet((wide,)))
    assert index.population(None) == 3
    assert index.population(wide) == 3
    assert index.population(POLICY) == 2  # a policy it was not told about: scanned


def test_a_view_reads_the_live_index() -> None:
    index = small_index("n1", "n2")
    v = index.view()
    index.set_node(NodeView("n2", {"gpu": "true"}, unschedulable=True))
    assert v.nodes["n2"].unschedulable
    assert check_admission("n1", (), POLICY, v, T0).block is not None


# ---------------------------------------------------------------------------------------------
# Guardrails count what Slurm counts (issue 12)


@pytest.mark.parametrize(("base", "flags", "cause"), [
    ("IDLE", (), ""),
    ("ALLOCATED", (), ""),
    ("MIXED", ("COMPLETING",), ""),
    ("IDLE", ("POWERED_DOWN",), ""),  # power saving resumes it for the next job
    ("UNKNOWN", (), ""),  # slurmctld just restarted: not yet heard from
    ("IDLE", ("UNDRAIN", "DRAIN"), ""),
    ("IDLE", ("DRAIN",), "slurm-drain"),  # an admin's or HealthCheckProgram's drain
    ("MIXED", ("DRAIN",), "slurm-drain"),  # draining: takes no new jobs
    ("DOWN", (), "slurm-down"),
    ("DOWN", ("DRAIN", "NOT_RESPONDING"), "slurm-down"),
    ("ERROR", (), "slurm-down"),
    ("FUTURE", (), "slurm-down"),
    ("IDLE", ("NOT_RESPONDING",), "slurm-not-responding"),
    ("UNKNOWN", ("NOT_RESPONDING",), "slurm-not-responding"),
    ("IDLE", ("FAIL", "DRAIN"), "slurm-fail"),
    ("ALLOCATED", ("FAILING",), "slurm-fail"),
    ("IDLE", ("REBOOT_ISSUED",), "slurm-reboot"),
    ("IDLE", ("REBOOT_REQUESTED",), ""),  # it runs its jobs until idle
    ("IDLE", ("POWER_DOWN",), "slurm-power-down"),
    ("IDLE", ("POWERING_DOWN",), "slurm-power-down"),
    ("IDLE", ("MAINTENANCE",), "slurm-maintenance"),
    ("idle", ("drain",), "slurm-drain"),  # any case
])
def test_slurm_cause(base: str, flags: tuple[str, ...], cause: str) -> None:
    assert slurm_cause(base, frozenset(flags)) == cause
    assert cause == "" or cause in CAUSES


@pytest.mark.parametrize(("n", "rec", "slurm", "cause"), [
    (node("n1"), None, "", ""),
    (node("n1"), None, "slurm-drain", "slurm-drain"),
    (node("n1", unschedulable=True), None, "slurm-drain", "cordoned"),
    (node("n1", ready=False), None, "slurm-down", "not-ready"),
    (node("n1", unschedulable=True, ready=False), None, "", "cordoned"),
    (node("n1"), record(Phase.DRAINING), "slurm-drain", "healer"),  # healer's own drain
    (node("n1"), record(Phase.FAILED), "slurm-down", "slurm-down"),  # not admitted yet
])
def test_unavailable_cause_names_the_first_reason(n: NodeView, rec: object, slurm: str,
                                                  cause: str) -> None:
    r = open_remediation(rec) if isinstance(rec, NodeRecord) else None
    assert unavailable_cause(n, r, slurm) == cause


def slurm_view(pol: cp.Policy, slurm: dict[str, str], *, nodes: list[NodeView] | None = None,
               records: list[NodeRecord] | None = None, state: str = "ok") -> BudgetView:
    ns = nodes if nodes is not None else [node(f"n{i}") for i in range(1, 11)]
    return budget_view(policies(pol), {n.name: n for n in ns}, records or [], records or [],
                       slurm=slurm, slurm_view=SlurmView(state))


@pytest.mark.parametrize(("slurm", "allowed", "said"), [
    ({}, True, ""),
    ({"n2": "slurm-drain"}, True, ""),
    ({"n2": "slurm-drain", "n3": "slurm-down"}, False,
     "2 of 10 nodes unavailable (1 slurm-down, 1 slurm-drain); taking n1 makes 3, limit 2"),
    ({"n2": "slurm-not-responding", "n3": "slurm-maintenance"}, False,
     "(1 slurm-not-responding, 1 slurm-maintenance)"),
    ({"n1": "slurm-drain", "n2": "slurm-down"}, True, ""),  # n1 already counts itself
])
def test_max_unavailable_counts_nodes_slurm_will_not_use(slurm: dict[str, str], allowed: bool,
                                                          said: str) -> None:
    pol = policy(guardrails=g(max_unavailable=cp.Quantity(2)))
    a = check_admission("n1", (), pol, slurm_view(pol, slurm), T0)
    assert a.allowed is allowed, a
    if not allowed:
        assert a.block is not None
        assert a.block.guardrail == "max-unavailable"
        assert said in a.block.message


def test_slurm_causes_count_in_failure_domains_and_usage() -> None:
    pol = policy(guardrails=g(failure_domains=(cp.FailureDomain("zone", 1),)))
    nodes = [node("n1", zone="a"), node("n2", zone="a"), node("n3", zone="b")]
    v = slurm_view(pol, {"n2": "slurm-drain", "n3": "slurm-down"}, nodes=nodes)
    a = check_admission("n1", (), pol, v, T0)
    assert not a.allowed
    assert a.block is not None
    assert a.block.guardrail == "failure-domain"
    rows = {u.scope: u for u in usage(v, T0)}
    assert rows["p"].unavailable == 2
    assert rows["p"].causes == {"slurm-drain": 1, "slurm-down": 1}
    assert rows["fleet"].slurm == "ok"


@pytest.mark.parametrize(("guardrails", "allowed"), [
    (g(max_unavailable=cp.Quantity(5)), False),
    (g(failure_domains=(cp.FailureDomain("zone", 3),)), False),
    (g(max_concurrent=3), True),  # nothing here needs Slurm's view
    (g(), True),
])
def test_an_unknown_slurm_view_holds_only_limits_that_need_it(guardrails: cp.Guardrails,
                                                               allowed: bool) -> None:
    pol = policy(guardrails=guardrails)
    v = slurm_view(pol, {}, nodes=[node("n1", zone="a"), node("n2", zone="a")], state="unknown")
    a = check_admission("n1", (), pol, v, T0)
    assert a.allowed is allowed
    if not allowed:
        assert a.block is not None
        assert a.block.guardrail == "slurm-unknown"
        assert "Slurm's node states cannot be read" in a.block.message
        assert a.recheck_after == 30.0
    known = slurm_view(pol, {}, nodes=[node("n1", zone="a"), node("n2", zone="a")])
    assert check_admission("n1", (), pol, known, T0).allowed


def test_one_replacement_is_counted_once_on_the_bad_node_then_on_its_spare() -> None:
    """maxUnavailable 1 of n1..n3 + spare s1. n1 is being replaced by s1: while the swap is in
    flight n1 counts (healer's) and s1 is not a member, even when its slurmd registers still
    drained with healer's reason; in Repair n1 is out (replaced) and s1 is the member, counted
    by its own state."""
    pol = policy(guardrails=g(max_unavailable=cp.Quantity(1)))
    nodes = [node("n1"), node("n2"), node("n3"), node("s1")]  # s1 claimed: no spare label
    swapping = record(Phase.ANNOTATING, nodename="n1", spare="s1",
                      ledger=(done_step("drain"), done_step("cordon")))
    v = slurm_view(pol, {"s1": "slurm-drain", "n1": "slurm-drain"}, nodes=nodes,
                   records=[swapping])
    facts = v.facts()
    assert (facts.population(pol), facts.unavailable(pol)) == (3, 1)
    assert facts.cause(pol, "n1") == "healer"
    assert not check_admission("n2", (), pol, v, T0).allowed
    repair = replace(swapping, phase=Phase.REPAIR)
    v = slurm_view(pol, {"n1": "slurm-drain"}, nodes=nodes, records=[repair])
    facts = v.facts()
    assert (facts.population(pol), facts.unavailable(pol), facts.replaced(pol)) == (3, 0, 1)
    assert check_admission("n2", (), pol, v, T0).allowed
    # the replacement stops serving in Slurm: it counts, by its own cause
    v = slurm_view(pol, {"s1": "slurm-not-responding"}, nodes=nodes, records=[repair])
    assert v.facts().causes(pol) == {"slurm-not-responding": 1}
    assert not check_admission("n2", (), pol, v, T0).allowed
