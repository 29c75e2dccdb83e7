"""Guardrails: may a remediation take a node out of service now? Pure.

Checked once per remediation, when it is *admitted* (the step from Degrading/Failed to the first
disruptive action). An admitted remediation holds its slot until it leaves the active phases.
Recovery actions (undrain, uncordon, release, cancel) are never gated: nothing here is consulted
for them, so neither the breaker nor any limit can keep capacity out.

Capacity accounting, for a *population* of nodes (a policy's nodes, or every governed node):

* the population is the nodes the selector matches, minus warm spares, minus nodes that a spare
  has already replaced (their record is in Repair with a spare: the replacement was undrained
  and serves under the same Slurm name, and *it* is the member now, counted with its own
  state); a claimed spare is a member only from then on: while its remediation is in flight
  (claimed, not yet in Repair) the node it replaces is the one counted (as healer's), so one
  unit of capacity is counted once, on the bad node until the replacement serves, then on
  the replacement;
* a node is *unavailable* when it cannot take jobs, in Kubernetes or in Slurm, whoever caused
  it (:func:`unavailable_cause`, :data:`CAUSES`): healer holds it out of service (an admitted
  remediation, an escalation that drained it, an in-place repair), anyone cordoned it, it is
  NotReady, or Slurm reports it DOWN, NOT_RESPONDING, FAIL(ING), drained or draining (an
  admin, HealthCheckProgram, the operator), REBOOT_ISSUED, powering down, or in a MAINT
  reservation (the runtime's Slurm feed tells the index, as a cause per node);
* when the driver has a Slurm feed and Slurm's node states cannot be read (``slurm_unknown``),
  nothing is admitted in a scope with a ``maxUnavailable`` or failure-domain limit: those
  limits cannot be checked, so they say no (guardrail ``slurm-unknown``);
* an admitted remediation holds a ``maxConcurrent`` slot from admission until its replacement
  serves; a node coming back from an in-place repair is giving capacity back and holds none;
* admitting node N is allowed only if ``len(unavailable | {N})`` stays within ``maxUnavailable``,
  and likewise within each failure domain (nodes sharing N's value of the domain label).

The breaker counts distinct nodes whose incidents opened within the sliding window. It trips at
the first incident that brings the count to the threshold and stays tripped for ``cooldown``
after the last such incident; then it closes by itself. Its state is a function of the incident
history alone, so a restarted or new leader computes the same state from the records.

The checks read their numbers through :class:`GuardrailFacts`: the fleet index a view is made
by (:class:`healer.core.capacity.FleetIndex`, also behind :func:`healer.core.fleet.budget_view`)
answers each in O(1) from incrementally kept counts.
"""

from __future__ import annotations

import enum
import math
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from healer.core.intervals import GUARDRAIL_RECHECK, PAUSED_RECHECK
from healer.core.model import Guardrail, GuardrailBlock, NodeView, OpenRemediation, PastIncident
from healer.core.nodesets import NodeSetRules
from healer.core.rules import Breaker, Guardrails, MassDeath, Policy, PolicySet
from healer.core.timefmt import rfc3339
from healer.core.unavailability import CAUSES

Scope = Policy | NodeSetRules | None
"""Where a limit applies: a policy's nodes, a NodeSet's, or (None) every governed node."""


def nodeset_name(policies: PolicySet, node: NodeView | None) -> str:
    """The NodeSet ``node`` belongs to ("" for none, or an unknown node)."""
    ns = policies.nodesets.of(node.labels) if node is not None and policies.nodesets else None
    return ns.name if ns is not None else ""


class GuardrailFacts(Protocol):
    """The numbers the guardrails read, per scope (``policy``: a policy, a NodeSet, or None:
    the whole fleet)."""

    def members(self, policy: Scope) -> AbstractSet[str]:
        """The names of the nodes the scope's limits are computed over."""

    def population(self, policy: Scope) -> int:
        """How many nodes the scope's limits are computed over."""

    def unavailable(self, policy: Scope) -> int:
        """How many of them are unavailable."""

    def is_unavailable(self, policy: Scope, node: str) -> bool:
        """Is ``node`` one of the scope's unavailable nodes?"""

    def domain_unavailable(self, policy: Scope, key: str, value: str) -> int:
        """How many of the scope's unavailable nodes have label ``key`` = ``value``."""

    def causes(self, policy: Scope) -> Mapping[str, int]:
        """The scope's unavailable nodes by cause (:data:`CAUSES`; only causes with nodes)."""

    def cause(self, policy: Scope, node: str) -> str:
        """Why ``node`` is one of the scope's unavailable nodes ("" if it is not)."""

    def replaced(self, policy: Scope) -> int:
        """Nodes of the scope's selector that a spare replaced (out of the population)."""

    def not_ready(self, policy: Scope,
                  domain: tuple[str, str] | None = None) -> Mapping[str, float]:
        """The scope's members whose Ready condition is not True (with label ``domain`` =
        (key, value), when given), with since when."""

    def returned(self, policy: Scope, since: float,
                 domain: tuple[str, str] | None = None) -> Mapping[str, float]:
        """The scope's members whose Ready condition turned True at or after ``since`` (with
        label ``domain`` = (key, value), when given), with when."""

    def domain_members(self, policy: Scope, key: str, value: str) -> int:
        """How many of the scope's members have label ``key`` = ``value``."""

    def active(self, policy: Scope, excluding: str | None = None) -> int:
        """Open remediations holding a maxConcurrent slot, not counting ``excluding``'s."""

    def has_incident(self, policy: Scope, incident: str) -> bool:
        """Is incident ``incident`` among the scope's incidents?"""

    def breaker_times(self, policy: Scope, since: float,
                      now: float) -> Sequence[tuple[float, str]]:
        """``(opened_at, node)`` of the scope's incidents, in time order: at least every one
        with ``since <= opened_at <= now`` (more are harmless)."""

    def incidents_on_node(self, node: str) -> Iterable[PastIncident]:
        """At least every incident of ``node``."""

    def incidents_with_serial(self, serial: str) -> Iterable[PastIncident]:
        """At least every incident naming GPU ``serial``."""


class SlurmView(enum.StrEnum):
    """The state of the Slurm feed, as the guardrails see it (and ``/debug/state`` says)."""

    OFF = "off"  # no feed: only Kubernetes is counted
    OK = "ok"  # Slurm's node states are read
    UNKNOWN = "unknown"  # they cannot be read: limits that count Slurm say no


@dataclass(frozen=True, slots=True)
class BudgetView:
    """What the guardrails see of the fleet when a step runs.

    ``index`` answers the guardrails' questions without a scan (the fleet index the view was
    made by, :meth:`healer.core.capacity.FleetIndex.view`).
    """

    policies: PolicySet
    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    open: Mapping[str, OpenRemediation] = field(default_factory=dict)
    incidents: Collection[PastIncident] = ()
    paused: bool = False
    paused_nodes: AbstractSet[str] = frozenset()
    index: GuardrailFacts = field(kw_only=True, compare=False, repr=False)
    slurm: Mapping[str, str] = field(default_factory=dict)
    """Node → why Slurm will not start jobs there (:func:`slurm_cause`); absent: it will."""
    slurm_view: SlurmView = SlurmView.OFF
    """The Slurm feed's state."""

    def is_paused(self, node: str) -> bool:
        return self.paused or self.policies.fleet.paused or node in self.paused_nodes

    def facts(self) -> GuardrailFacts:
        return self.index

    @property
    def slurm_unknown(self) -> bool:
        return self.slurm_view is SlurmView.UNKNOWN


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
    times = sorted((i.opened_at, i.node) for i in incidents if i.opened_at <= now)
    return _breaker(cfg, times, breaker_threshold(cfg, population), now)


def breaker_since(cfg: Breaker, now: float) -> float:
    """Incidents opened before this cannot change the breaker's state at ``now``: it is
    tripped only by a trip after ``now - cooldown``, which counts the window before it, and
    its count is the window before ``now`` (a second of margin for rounding)."""
    return now - cfg.window - max(cfg.cooldown, 0.0) - 1.0


def _breaker(cfg: Breaker, times: Sequence[tuple[float, str]], threshold: int,
             now: float) -> BreakerStatus:
    """The breaker over ``times`` (time order; later than ``now`` ignored), in one sweep.

    The last trip is the latest incident time ``t`` (not older than ``window + cooldown``)
    at which the distinct nodes with incidents in ``(t - window, t]`` reach the threshold.
    """
    span = cfg.window + cfg.cooldown
    inside: dict[str, int] = {}
    lo = hi = i = 0
    n = len(times)
    last_trip: float | None = None
    while i < n:
        t = times[i][0]
        if t > now:
            break
        j = i + 1
        while j < n and times[j][0] == t:
            j += 1
        if not now - t >= span:
            for _, node in times[hi:j]:
                inside[node] = inside.get(node, 0) + 1
            hi = max(hi, j)
            start = t - cfg.window
            while lo < hi and not start < times[lo][0]:
                node = times[lo][1]
                inside[node] -= 1
                if not inside[node]:
                    del inside[node]
                lo += 1
            if len(inside) >= threshold:
                last_trip = t
        i = j
    count = len({nd for t, nd in times if now - cfg.window < t <= now})
    if last_trip is not None and now < last_trip + cfg.cooldown:
        return BreakerStatus(True, count, threshold, last_trip + cfg.cooldown)
    return BreakerStatus(False, count, threshold, None)


def scope_breaker(cfg: Breaker, facts: GuardrailFacts, policy: Scope, population: int,
                  now: float, extra: tuple[float, str] | None = None) -> BreakerStatus:
    """The breaker of a scope, optionally counting one more incident ``(opened_at, node)``."""
    since = breaker_since(cfg, now)
    times = list(facts.breaker_times(policy, since, now))
    if extra is not None and since <= extra[0]:
        times.insert(bisect_right(times, extra), extra)
    return _breaker(cfg, times, breaker_threshold(cfg, population), now)


def population(view: BudgetView, policy: Scope) -> list[NodeView]:
    """The nodes a limit is computed over (see the module docstring), in ``view.nodes``
    order. O(fleet): ``view.facts().population(policy)`` is the count."""
    names = view.index.members(policy)
    return [n for n in view.nodes.values() if n.name in names]


def check_admission(node: str, serials: tuple[str, ...], policy: Policy, view: BudgetView,
                    now: float, incident: str = "", opened_at: float | None = None, *,
                    dead: bool = False) -> Admission:
    """May ``node`` (governed by ``policy``) be taken out of service now?

    ``incident``/``opened_at`` identify the incident asking; it counts towards the breaker
    (its node went bad too) but not against its own retry budget. A ``dead`` node is already
    out: replacing it takes nothing more, so only pause, the retry budget, the breaker and the
    policy's mass-death breaker (:func:`mass_death`) may hold it; maxConcurrent,
    maxUnavailable and the failure-domain limits never do.
    """
    if view.is_paused(node):
        return Admission(False, GuardrailBlock(Guardrail.PAUSE, "remediation is paused"), False,
                         PAUSED_RECHECK)
    facts = view.facts()

    budget = policy.guardrails.retry_budget or view.policies.fleet.guardrails.retry_budget
    if budget is not None:
        def recent(i: PastIncident) -> bool:
            return i.id != incident and now - budget.window <= i.opened_at <= now

        on_node = sum(1 for i in facts.incidents_on_node(node) if i.node == node and recent(i))
        if on_node >= budget.per_node:
            return Admission(False, GuardrailBlock(
                Guardrail.RETRY_BUDGET_NODE,
                f"node {node} had {on_node} incidents in the last "
                f"{budget.window / 86400:g}d (budget {budget.per_node})",
                on_node, budget.per_node), escalate=True)
        for serial in serials:
            if not serial:
                continue
            n = sum(1 for i in facts.incidents_with_serial(serial)
                    if serial in i.serials and recent(i))
            if n >= budget.per_gpu_serial:
                return Admission(False, GuardrailBlock(
                    Guardrail.RETRY_BUDGET_GPU,
                    f"GPU serial {serial} failed {n} times in the last "
                    f"{budget.window / 86400:g}d (budget {budget.per_gpu_serial})",
                    n, budget.per_gpu_serial), escalate=True)

    scopes: list[tuple[str, Guardrails, Scope]] = [
        (f"policy {policy.name}", policy.guardrails, policy)]
    nodeset = view.policies.nodesets.get(nodeset_name(view.policies, view.nodes.get(node)))
    if nodeset is not None:
        scopes.append((f"NodeSet {nodeset.name}", nodeset.guardrails, nodeset))
    scopes.append(("fleet", view.policies.fleet.guardrails, None))
    for scope, g, pol in scopes:
        size = facts.population(pol)
        if dead and policy.dead.enabled:
            found = mass_death(policy.dead.mass_death, facts, pol, view.nodes.get(node), now)
            if found is not None:
                return Admission(False, GuardrailBlock(
                    Guardrail.MASS_DEATH,
                    f"{scope} breaker tripped: {found.describe()}: suspect the "
                    "control plane or the network, not the nodes; nothing is fenced or swapped "
                    "here until they answer again (and one window more)", found.count, found.limit),
                    recheck_after=GUARDRAIL_RECHECK)
        if g.breaker is not None:
            extra = None
            if opened_at is not None and not facts.has_incident(pol, incident):
                extra = (opened_at, node)
            st = scope_breaker(g.breaker, facts, pol, size, now, extra)
            if st.tripped:
                until = st.until if st.until is not None else now
                return Admission(False, GuardrailBlock(
                    Guardrail.BREAKER,
                    f"{scope} breaker tripped: {st.count} nodes went bad within "
                    f"{g.breaker.window:g}s (threshold {st.threshold}); it closes at "
                    f"{rfc3339(until)} unless more fail", st.count, st.threshold),
                    recheck_after=max(until - now, 1.0))
        if dead:
            continue  # already out: the capacity limits do not apply (it takes nothing more)
        if g.max_concurrent is not None:
            active = facts.active(pol, node)
            if active + 1 > g.max_concurrent:
                return Admission(False, GuardrailBlock(
                    Guardrail.MAX_CONCURRENT,
                    f"{scope}: {active} remediations in flight, limit {g.max_concurrent}",
                    active, g.max_concurrent), recheck_after=GUARDRAIL_RECHECK)
        if view.slurm_unknown and (g.max_unavailable is not None or g.failure_domains):
            return Admission(False, GuardrailBlock(
                Guardrail.SLURM_UNKNOWN,
                f"{scope}: Slurm's node states cannot be read, so its maxUnavailable and "
                "failure-domain limits cannot be checked; nothing is taken out until they "
                "can"), recheck_after=GUARDRAIL_RECHECK)
        # the node is unavailable iff it is a member and down; then it is in its own domain too
        itself = 0 if facts.is_unavailable(pol, node) else 1
        if g.max_unavailable is not None:
            down = facts.unavailable(pol)
            limit = g.max_unavailable.of(size)
            after = down + itself
            if after > limit:
                return Admission(False, GuardrailBlock(
                    Guardrail.MAX_UNAVAILABLE,
                    f"{scope}: {down} of {size} nodes unavailable{describe(facts.causes(pol))}"
                    f"; taking {node} makes {after}, limit {g.max_unavailable} = {limit}",
                    after, limit), recheck_after=GUARDRAIL_RECHECK)
        target = view.nodes.get(node)
        for fd in g.failure_domains:
            value = target.labels.get(fd.key) if target is not None else None
            if value is None:
                continue
            after = facts.domain_unavailable(pol, fd.key, value) + itself
            if after > fd.max_unavailable:
                return Admission(False, GuardrailBlock(
                    Guardrail.FAILURE_DOMAIN,
                    f"{scope}: {fd.key}={value} would have {after} nodes unavailable, "
                    f"limit {fd.max_unavailable}", after, fd.max_unavailable),
                    recheck_after=GUARDRAIL_RECHECK)
    return ALLOWED


@dataclass(frozen=True, slots=True)
class MassDeathFinding:
    """Too many of a scope's (or one failure domain's) nodes went NotReady together."""

    count: int  # nodes of one outage (:func:`outage`)
    limit: int
    population: int
    window: float
    domain: str = ""  # "key=value" of the failure domain; "": the whole scope

    def describe(self) -> str:
        where = f"failure domain {self.domain}" if self.domain else "its nodes"
        return (f"{self.count} of {self.population} nodes of {where} went NotReady within "
                f"{self.window:g}s (more than {self.limit})")


def outage(down: Iterable[float], back: Iterable[float], window: float) -> int:
    """The most nodes of one outage: the most of ``down`` (since when NotReady) within one
    ``window`` of each other, plus the ``back`` ones (since when Ready again) that answered at
    or after the first of them (they were out with it; a node that answered before the first of
    them went NotReady, such as a repaired node coming back, is an earlier, separate fault)."""
    ts = sorted(down)
    bs = sorted(back)
    best = hi = 0
    for lo, t in enumerate(ts):
        while hi < len(ts) and ts[hi] - t <= window:
            hi += 1
        best = max(best, hi - lo + len(bs) - bisect_left(bs, t))
    return best


def mass_death(cfg: MassDeath, facts: GuardrailFacts, scope: Scope, node: NodeView | None,
               now: float) -> MassDeathFinding | None:
    """Whether too many of ``scope``'s nodes went NotReady together: of the whole scope, or of
    ``node``'s failure domains (``cfg.domains``). Counted (:func:`outage`): the most NotReady
    nodes whose NotReady began within one window of each other, plus the nodes that answered
    again within the last window after the first of those went NotReady (an outage healing
    node by node is still one event: its last nodes are not node faults). A function of the
    nodes' Ready conditions alone: it closes by itself one window after they answer again, and
    a new leader computes the same. O(NotReady and recently Ready nodes of the scope)."""
    down = facts.not_ready(scope)
    if not down:
        return None
    since = now - cfg.window
    back = facts.returned(scope, since)
    if len(down) + len(back) < 2:
        return None  # one dead node is a node fault
    pop = facts.population(scope)
    limit = cfg.max_share.of(pop)
    n = outage((t for t in down.values() if t <= now), back.values(), cfg.window)
    if n > limit:
        return MassDeathFinding(n, limit, pop, cfg.window)
    if node is None:
        return None
    for key in cfg.domains:
        value = node.labels.get(key)
        if value is None:
            continue
        members = facts.domain_members(scope, key, value)
        limit = cfg.max_share_per_domain.of(members)
        there = facts.not_ready(scope, (key, value))
        if not there:
            continue
        n = outage((t for t in there.values() if t <= now),
                   facts.returned(scope, since, (key, value)).values(), cfg.window)
        if n > limit:
            return MassDeathFinding(n, limit, members, cfg.window, f"{key}={value}")
    return None


def describe(causes: Mapping[str, int]) -> str:
    """`` (1 cordoned, 2 slurm-drain)`` in :data:`CAUSES` order; "" when there are none."""
    parts = [f"{causes[c]} {c}" for c in CAUSES if causes.get(c)]
    return f" ({', '.join(parts)})" if parts else ""


@dataclass(frozen=True, slots=True)
class GuardrailUsage:
    scope: str
    population: int
    unavailable: int
    max_unavailable: int | None
    active: int
    max_concurrent: int | None
    breaker: BreakerStatus | None
    causes: Mapping[str, int] = field(default_factory=dict)
    """The unavailable nodes by cause (only causes with nodes)."""
    replaced: int = 0
    """Nodes in Repair whose spare serves in their place (not in the population)."""
    slurm: SlurmView = SlurmView.OFF
    """The Slurm feed: off, ok or unknown (see :class:`BudgetView`)."""
    mass_death: MassDeathFinding | None = None
    """A policy's mass-death breaker, tripped (None: closed, or no dead-node handling)."""


def mass_death_anywhere(cfg: MassDeath, view: BudgetView, scope: Scope,
                        now: float) -> MassDeathFinding | None:
    """:func:`mass_death` of ``scope`` as a whole and of every failure domain that has a
    NotReady node (for metrics and ``/debug/state``)."""
    facts = view.facts()
    found = mass_death(cfg, facts, scope, None, now)
    if found is not None:
        return found
    seen: set[tuple[str, str]] = set()
    for name in facts.not_ready(scope):
        n = view.nodes.get(name)
        if n is None:
            continue
        for key in cfg.domains:
            value = n.labels.get(key)
            if value is None or (key, value) in seen:
                continue
            seen.add((key, value))
            found = mass_death(cfg, facts, scope, n, now)
            if found is not None:
                return found
    return None


def usage(view: BudgetView, now: float) -> list[GuardrailUsage]:
    """Current use of every guardrail, for metrics and ``/debug/state``."""
    facts = view.facts()
    out: list[GuardrailUsage] = []
    scopes: list[tuple[str, Guardrails, Scope]] = [
        ("fleet", view.policies.fleet.guardrails, None)]
    scopes += [(p.name, p.guardrails, p) for p in view.policies.policies]
    scopes += [(ns.scope, ns.guardrails, ns) for ns in view.policies.nodesets.items]
    for scope, g, pol in scopes:
        size = facts.population(pol)
        br = None
        if g.breaker is not None:
            br = scope_breaker(g.breaker, facts, pol, size, now)
        md = None
        if isinstance(pol, Policy) and pol.dead.enabled:
            md = mass_death_anywhere(pol.dead.mass_death, view, pol, now)
        out.append(GuardrailUsage(
            scope, size, facts.unavailable(pol),
            g.max_unavailable.of(size) if g.max_unavailable else None,
            facts.active(pol), g.max_concurrent, br, dict(facts.causes(pol)),
            facts.replaced(pol), view.slurm_view, md))
    return out
