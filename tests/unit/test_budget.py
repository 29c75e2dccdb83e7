"""Guardrails: each limit, with the numbers it reports, and the breaker over time."""

from __future__ import annotations

import pytest

from healer.core import policy as cp
from healer.core.budget import (
    PastIncident,
    breaker_status,
    breaker_threshold,
    check_admission,
    usage,
)
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
    assert "2 of 4 nodes unavailable; taking n1 makes 3, limit 2" in a.block.message
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
