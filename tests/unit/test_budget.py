"""Guardrails: each limit, with the numbers it reports, and the breaker over time; and the
fleet index behind the views, told of each kind of change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from healer.core import policy as cp
from healer.core.budget import (
    PastIncident,
    breaker_status,
    breaker_threshold,
    check_admission,
    usage,
)
from healer.core.capacity import FleetIndex
from healer.core.fleet import budget_view
from healer.core.model import NodeView
from healer.core.phases import Phase
from tests.builders import T0, node, policies, policy, record, view


def g(**kw: object) -> cp.Guardrails:
    return cp.Guardrails(**kw)  # type: ignore[arg-type]


def admit(pol: cp.Policy, v: object, n: str = "n1", serials: tuple[str, ...] = (),
          fleet: cp.FleetGuardrails | None = None, now: float = T0) -> object:
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
    fleet = cp.FleetGuardrails(guardrails=g(max_concurrent=1))
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
    index.set_record(replace(rec, phase=Phase.DONE.value))
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
    index.set_record(replace(rec, phase=Phase.SUSPECT.value))
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
    index.set_policies(cp.PolicySet((POLICY,), cp.FleetGuardrails(spare_selector=cp.LabelSelector(
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
