"""Guardrails: may a remediation take a node out of service now? Pure.

Checked once per remediation, when it is *admitted* (the step from Degrading/Failed to the first
disruptive action). An admitted remediation holds its slot until it leaves the active phases.
Recovery actions (undrain, uncordon, release, cancel) are never gated: nothing here is consulted
for them, so neither the breaker nor any limit can keep capacity out.

Capacity accounting, for a *population* of nodes (a policy's nodes, or every governed node):

* the population is the nodes the selector matches, minus warm spares, minus nodes that a spare
  has already replaced (their record is in Repair with a spare: they are out of the fleet);
* a node is *unavailable* if anyone cordoned it, it is NotReady, or healer holds it out of
  service (an admitted remediation, an escalation that drained it, an in-place repair);
* an admitted remediation holds a ``maxConcurrent`` slot from admission until its replacement
  serves; a node coming back from an in-place repair is giving capacity back and holds none;
* admitting node N is allowed only if ``len(unavailable | {N})`` stays within ``maxUnavailable``,
  and likewise within each failure domain (nodes sharing N's value of the domain label).

The breaker counts distinct nodes whose incidents opened within the sliding window. It trips at
the first incident that brings the count to the threshold and stays tripped for ``cooldown``
after the last such incident; then it closes by itself. Its state is a function of the incident
history alone, so a restarted or new leader computes the same state from the records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from healer.core.model import GuardrailBlock, NodeView
from healer.core.phases import Phase
from healer.core.policy import Breaker, Guardrails, Policy, PolicySet
from healer.core.timefmt import rfc3339


@dataclass(frozen=True, slots=True)
class OpenRemediation:
    """What the guardrails need to know about a record that is not closed."""

    node: str
    policy: str
    phase: Phase
    opened_at: float
    spare: str = ""
    out_of_service: bool = False  # healer holds the node out (drained/cordoned, not undone)
    active: bool = False  # holds a maxConcurrent slot (see machine.counts_as_active)


@dataclass(frozen=True, slots=True)
class PastIncident:
    """An incident opened recently (open or closed), for the breaker and retry budgets."""

    id: str
    node: str
    opened_at: float
    policy: str = ""
    serials: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BudgetView:
    """A consistent snapshot of the fleet, taken by the runtime before each step."""

    policies: PolicySet
    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    open: Mapping[str, OpenRemediation] = field(default_factory=dict)
    incidents: tuple[PastIncident, ...] = ()
    paused: bool = False
    paused_nodes: frozenset[str] = frozenset()

    def is_paused(self, node: str) -> bool:
        return self.paused or self.policies.fleet.paused or node in self.paused_nodes


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    tripped: bool
    count: int  # distinct nodes with incidents in the window ending now
    threshold: int
    until: float | None = None  # when a tripped breaker closes (if nothing else happens)


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    block: GuardrailBlock | None = None
    escalate: bool = False  # a retry budget is exhausted: a human must look, not a retry
    recheck_after: float | None = None


ALLOWED = Admission(True)


def breaker_threshold(cfg: Breaker, population: int) -> int:
    """The number of distinct nodes that trips the breaker: never below 2 (one bad node is
    a failure, not a storm), a percentage rounds up."""
    if cfg.threshold.percent:
        return max(math.ceil(population * cfg.threshold.value / 100.0), 2)
    return max(int(cfg.threshold.value), 2)


def breaker_status(cfg: Breaker, incidents: Iterable[PastIncident], population: int,
                   now: float) -> BreakerStatus:
    threshold = breaker_threshold(cfg, population)
    times = sorted((i.opened_at, i.node) for i in incidents if i.opened_at <= now)

    def distinct_in_window(end: float) -> int:
        return len({n for t, n in times if end - cfg.window < t <= end})

    last_trip: float | None = None
    for t, _ in times:
        if now - t >= cfg.window + cfg.cooldown:
            continue  # too old to matter
        if distinct_in_window(t) >= threshold:
            last_trip = t
    count = distinct_in_window(now)
    if last_trip is not None and now < last_trip + cfg.cooldown:
        return BreakerStatus(True, count, threshold, last_trip + cfg.cooldown)
    return BreakerStatus(False, count, threshold, None)


def population(view: BudgetView, policy: Policy | None) -> list[NodeView]:
    """The nodes a limit is computed over (see the module docstring)."""
    spare_sel = view.policies.fleet.spare_selector
    out: list[NodeView] = []
    for n in view.nodes.values():
        if spare_sel.match_labels and spare_sel.matches(n.labels):
            continue
        if policy is not None:
            if not policy.applies_to(n):
                continue
        elif view.policies.for_node(n) is None:
            continue
        rec = view.open.get(n.name)
        if rec is not None and rec.spare and rec.phase is Phase.REPAIR:
            continue  # replaced: its spare serves in its place
        out.append(n)
    return out


def unavailable(view: BudgetView, nodes: Iterable[NodeView]) -> set[str]:
    out: set[str] = set()
    for n in nodes:
        rec = view.open.get(n.name)
        if n.unschedulable or not n.ready or (rec is not None and (
                rec.active or rec.out_of_service)):
            out.add(n.name)
    return out


def check_admission(node: str, serials: tuple[str, ...], policy: Policy, view: BudgetView,
                    now: float, incident: str = "", opened_at: float | None = None) -> Admission:
    """May ``node`` (governed by ``policy``) be taken out of service now?

    ``incident``/``opened_at`` identify the incident asking; it counts towards the breaker
    (its node went bad too) but not against its own retry budget.
    """
    if view.is_paused(node):
        return Admission(False, GuardrailBlock("pause", "remediation is paused"), False, 60.0)

    budget = policy.guardrails.retry_budget or view.policies.fleet.guardrails.retry_budget
    if budget is not None:
        past = [i for i in view.incidents
                if i.id != incident and now - budget.window <= i.opened_at <= now]
        on_node = sum(1 for i in past if i.node == node)
        if on_node >= budget.per_node:
            return Admission(False, GuardrailBlock(
                "retry-budget-node",
                f"node {node} had {on_node} incidents in the last "
                f"{budget.window / 86400:g}d (budget {budget.per_node})",
                on_node, budget.per_node), escalate=True)
        for serial in serials:
            if not serial:
                continue
            n = sum(1 for i in past if serial in i.serials)
            if n >= budget.per_gpu_serial:
                return Admission(False, GuardrailBlock(
                    "retry-budget-gpu",
                    f"GPU serial {serial} failed {n} times in the last "
                    f"{budget.window / 86400:g}d (budget {budget.per_gpu_serial})",
                    n, budget.per_gpu_serial), escalate=True)

    scopes: list[tuple[str, Guardrails, Policy | None]] = [
        (f"policy {policy.name}", policy.guardrails, policy),
        ("fleet", view.policies.fleet.guardrails, None),
    ]
    for scope, g, pol in scopes:
        members = population(view, pol)
        if g.breaker is not None:
            incidents = [i for i in view.incidents if pol is None or i.policy == pol.name]
            if opened_at is not None and all(i.id != incident for i in incidents):
                incidents.append(PastIncident(incident, node, opened_at, policy.name, serials))
            st = breaker_status(g.breaker, incidents, len(members), now)
            if st.tripped:
                until = st.until if st.until is not None else now
                return Admission(False, GuardrailBlock(
                    "breaker",
                    f"{scope} breaker tripped: {st.count} nodes went bad within "
                    f"{g.breaker.window:g}s (threshold {st.threshold}); it closes at "
                    f"{rfc3339(until)} unless more fail", st.count, st.threshold),
                    recheck_after=max(until - now, 1.0))
        if g.max_concurrent is not None:
            active = sum(1 for r in view.open.values()
                         if r.node != node and r.active
                         and (pol is None or r.policy == pol.name))
            if active + 1 > g.max_concurrent:
                return Admission(False, GuardrailBlock(
                    "max-concurrent",
                    f"{scope}: {active} remediations in flight, limit {g.max_concurrent}",
                    active, g.max_concurrent), recheck_after=30.0)
        down = unavailable(view, members)
        if g.max_unavailable is not None:
            limit = g.max_unavailable.of(len(members))
            after = len(down | {node})
            if after > limit:
                return Admission(False, GuardrailBlock(
                    "max-unavailable",
                    f"{scope}: {len(down)} of {len(members)} nodes unavailable; taking {node} "
                    f"makes {after}, limit {g.max_unavailable} = {limit}", after, limit),
                    recheck_after=30.0)
        target = view.nodes.get(node)
        for fd in g.failure_domains:
            value = target.labels.get(fd.key) if target is not None else None
            if value is None:
                continue
            same = [m for m in members if m.labels.get(fd.key) == value]
            after = len(unavailable(view, same) | {node})
            if after > fd.max_unavailable:
                return Admission(False, GuardrailBlock(
                    "failure-domain",
                    f"{scope}: {fd.key}={value} would have {after} nodes unavailable, "
                    f"limit {fd.max_unavailable}", after, fd.max_unavailable),
                    recheck_after=30.0)
    return ALLOWED


@dataclass(frozen=True, slots=True)
class GuardrailUsage:
    scope: str
    population: int
    unavailable: int
    max_unavailable: int | None
    active: int
    max_concurrent: int | None
    breaker: BreakerStatus | None


def usage(view: BudgetView, now: float) -> list[GuardrailUsage]:
    """Current use of every guardrail, for metrics and ``/debug/state``."""
    out: list[GuardrailUsage] = []
    scopes: list[tuple[str, Guardrails, Policy | None]] = [
        ("fleet", view.policies.fleet.guardrails, None)]
    scopes += [(p.name, p.guardrails, p) for p in view.policies.policies]
    for scope, g, pol in scopes:
        members = population(view, pol)
        active = sum(1 for r in view.open.values()
                     if r.active and (pol is None or r.policy == pol.name))
        br = None
        if g.breaker is not None:
            incidents = [i for i in view.incidents if pol is None or i.policy == pol.name]
            br = breaker_status(g.breaker, incidents, len(members), now)
        out.append(GuardrailUsage(
            scope, len(members), len(unavailable(view, members)),
            g.max_unavailable.of(len(members)) if g.max_unavailable else None,
            active, g.max_concurrent, br))
    return out
