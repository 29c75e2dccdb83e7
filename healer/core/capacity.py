"""FleetIndex: what the guardrails need to know about the fleet, kept up to date incrementally.

Pure. The runtime tells the index about every change (a node appeared, changed or vanished; a
record was committed, dropped or garbage-collected) and asks it for a :class:`BudgetView` before
each step. The view reads the index's live tables: nothing is copied, and every guardrail
question (:class:`healer.core.budget.GuardrailFacts`) is answered in O(1), the breaker in
O(incidents within its window and cooldown).

Per scope (the fleet, and each policy) the index keeps the member set (the population), the
unavailable nodes with their causes and a count per cause, the replaced nodes, and per
failure-domain label value the member and unavailable counts. Whether a node is a member, and
why it is unavailable, is a function of its :class:`NodeView`, its open record and its Slurm
cause alone (:func:`healer.core.unavailability.unavailable_cause`), so a change re-places that one
node: O(#policies x #domains). Which policies select a node is matched only when its labels
change.

Slurm's view arrives the same way: the runtime's Slurm feed tells the index only what changed
(:meth:`FleetIndex.set_slurm`: this node now has this Slurm cause, or none), and whether Slurm
can be read at all (:meth:`FleetIndex.set_slurm_view`).

Incidents (open or closed, never suspicions) are kept by id, per node, per GPU serial, and per
scope in time order for the breaker.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType

from healer.core.budget import BudgetView, Scope, SlurmView
from healer.core.machine import counts_as_active, record_out_of_service, releases
from healer.core.model import NodeRecord, NodeView, OpenRemediation, PastIncident
from healer.core.nodesets import NodeSetRules
from healer.core.phases import Phase
from healer.core.rules import Policy, PolicySet
from healer.core.scope_counts import (
    REPLACED,
    Entry,
    NodeEntry,
    Placed,
    ScopeCounts,
    domain_keys,
    drop_incident,
    entry_time,
    remove_entry,
)
from healer.core.unavailability import claims_in_flight, replaced, unavailable_cause
from healer.core.vocabulary import PAUSE_ANNOTATION


def _keys(own: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*own, *extra)))


def past_incident(rec: NodeRecord) -> PastIncident:
    return PastIncident(rec.incident.id, rec.node, rec.incident.opened_at, rec.policy,
                        tuple(g.serial for g in rec.incident.gpus if g.serial))


def open_remediation(rec: NodeRecord) -> OpenRemediation:
    return OpenRemediation(rec.node, rec.policy, rec.phase, rec.incident.opened_at,
                           rec.spare, record_out_of_service(rec), counts_as_active(rec))


def node_paused(view: NodeView) -> bool:
    return view.annotations.get(PAUSE_ANNOTATION, "").lower() == "true"


class FleetIndex:
    """The guardrails' tables, changed one node or record at a time (see the module doc)."""

    def __init__(self, policies: PolicySet) -> None:
        self._nodes: dict[str, NodeView] = {}
        self._info: dict[str, NodeEntry] = {}
        self._placed: dict[str, Placed] = {}
        self._paused: dict[str, None] = {}
        self._open: dict[str, OpenRemediation] = {}
        self._open_incident: dict[str, str] = {}  # node -> id of its open record's incident
        self._active: dict[str, int] = {}  # policy name -> open records holding a slot
        self._active_ns: dict[str, int] = {}  # NodeSet name -> open records holding a slot
        self._open_ns: dict[str, str] = {}  # node -> its open record's NodeSet (if any)
        self._incident_ns: dict[str, str] = {}  # incident id -> its node's NodeSet (if any)
        self._times_by_ns: dict[str, list[Entry]] = {}
        self._active_total = 0
        self._incidents: dict[str, PastIncident] = {}
        self._times: list[Entry] = []
        self._times_by_policy: dict[str, list[Entry]] = {}
        self._by_node: dict[str, dict[str, PastIncident]] = {}
        self._by_serial: dict[str, dict[str, PastIncident]] = {}
        self._nodes_ro: Mapping[str, NodeView] = MappingProxyType(self._nodes)
        self._open_ro: Mapping[str, OpenRemediation] = MappingProxyType(self._open)
        self._slurm: dict[str, str] = {}  # node -> Slurm cause (only nodes that have one)
        self._slurm_ro: Mapping[str, str] = MappingProxyType(self._slurm)
        self._slurm_view = SlurmView.OFF
        self._claimed: dict[str, dict[str, None]] = {}  # spare -> nodes claiming it, in flight
        self._not_ready: dict[str, float] = {}  # node -> since when Ready is not True
        #: node -> since when Ready is True; entries older than every mass-death window are
        #: dropped as they are read (:meth:`returned`) and never added again (``_ready_floor``),
        #: so it holds the recent ones
        self._ready: dict[str, float] = {}
        self._ready_floor = float("-inf")
        self._max_mass_window = 0.0
        self._policies = policies
        self._scopes: list[ScopeCounts] = []
        self._scope_of: dict[str, list[int]] = {}
        self._ns_scope: dict[str, int] = {}
        self.set_policies(policies)

    # -- reading -------------------------------------------------------------------------

    @property
    def policies(self) -> PolicySet:
        return self._policies

    @property
    def nodes(self) -> Mapping[str, NodeView]:
        return self._nodes_ro

    @property
    def open(self) -> Mapping[str, OpenRemediation]:
        return self._open_ro

    @property
    def paused_nodes(self) -> AbstractSet[str]:
        return self._paused.keys()

    @property
    def slurm(self) -> Mapping[str, str]:
        """Node → its Slurm cause, for the nodes that have one."""
        return self._slurm_ro

    @property
    def slurm_view(self) -> SlurmView:
        return self._slurm_view

    def view(self, *, paused: bool = False) -> BudgetView:
        """A view of the index as it is (and will be: it reads the live tables; only the
        Slurm feed's state is read now). O(1)."""
        return BudgetView(self._policies, self._nodes_ro, self._open_ro,
                          self._incidents.values(), paused, self._paused.keys(),
                          self._slurm_ro, self._slurm_view, index=self)

    # -- policies --------------------------------------------------------------------------

    def set_policies(self, policies: PolicySet) -> None:
        """New policies (a reload): rebuild the populations from what the index holds.
        O(fleet x policies)."""
        self._policies = policies
        # every scope also counts the members of the mass-death breakers' failure domains
        extra = tuple(dict.fromkeys(k for p in policies.policies if p.dead.enabled
                                    for k in p.dead.mass_death.domains))
        self._max_mass_window = max((p.dead.mass_death.window for p in policies.policies
                                     if p.dead.enabled), default=0.0)
        fleet_keys = _keys(domain_keys(policies.fleet.guardrails), extra)
        self._scopes = [ScopeCounts(None, fleet_keys)]
        self._scope_of = {}
        for i, p in enumerate(policies.policies):
            self._scopes.append(ScopeCounts(p, _keys(domain_keys(p.guardrails), extra)))
            self._scope_of.setdefault(p.name, []).append(i + 1)
        self._ns_scope = {}
        for ns in policies.nodesets.items:
            self._ns_scope[ns.name] = len(self._scopes)
            self._scopes.append(ScopeCounts(ns, _keys(domain_keys(ns.guardrails), extra)))
        self._placed.clear()
        for name, view in self._nodes.items():
            self._info[name] = self._describe(view)
            self._place(name)
        self._retag()

    def _describe(self, view: NodeView, before: NodeEntry | None = None) -> NodeEntry:
        if before is not None and before.view.labels == view.labels:
            return NodeEntry(view, before.selected_by, before.spare, before.nodeset)
        spare = self._policies.is_spare(view.labels)
        selected = tuple(i for i, p in enumerate(self._policies.policies) if p.applies_to(view))
        ns = self._policies.nodesets.of(view.labels) if self._policies.nodesets else None
        return NodeEntry(view, selected, spare, ns.name if ns is not None else "")

    def _nodeset_of(self, node: str) -> str:
        info = self._info.get(node)
        return info.nodeset if info is not None else ""

    def _retag(self) -> None:
        """Which NodeSet each open record and incident counts in, from the nodes as they are
        now (after a reload changed the NodeSets). O(open + incidents)."""
        self._active_ns.clear()
        self._open_ns.clear()
        for node, rem in self._open.items():
            self._tag_open(node, rem)
        self._incident_ns.clear()
        self._times_by_ns.clear()
        for inc in self._incidents.values():
            self._tag_incident(inc)

    def _retag_node(self, node: str) -> None:
        """``node`` moved to another NodeSet (or was first seen after its records): count its
        open record and incidents where it is now."""
        rem = self._open.get(node)
        if rem is not None:
            ns = self._open_ns.pop(node, "")
            if ns and rem.active:
                self._active_ns[ns] -= 1
            self._tag_open(node, rem)
        for inc in self._by_node.get(node, {}).values():
            self._untag_incident(inc)
            self._tag_incident(inc)

    def _untag_incident(self, inc: PastIncident) -> None:
        ns = self._incident_ns.pop(inc.id, "")
        if ns:
            remove_entry(self._times_by_ns[ns], (inc.opened_at, inc.node, inc.id))
            if not self._times_by_ns[ns]:
                del self._times_by_ns[ns]

    def _tag_open(self, node: str, rem: OpenRemediation) -> None:
        ns = self._nodeset_of(node)
        if ns:
            self._open_ns[node] = ns
            if rem.active:
                self._active_ns[ns] = self._active_ns.get(ns, 0) + 1

    def _tag_incident(self, inc: PastIncident) -> None:
        ns = self._nodeset_of(inc.node)
        if ns:
            self._incident_ns[inc.id] = ns
            insort(self._times_by_ns.setdefault(ns, []), (inc.opened_at, inc.node, inc.id))

    # -- nodes -----------------------------------------------------------------------------

    def set_node(self, view: NodeView) -> None:
        """A Kubernetes node appeared or changed."""
        name = view.name
        self._nodes[name] = view
        before = self._nodeset_of(name)
        self._info[name] = self._describe(view, self._info.get(name))
        if self._info[name].nodeset != before:
            self._retag_node(name)
        if node_paused(view):
            self._paused[name] = None
        else:
            self._paused.pop(name, None)
        since = view.not_ready_since
        if since is None:
            self._not_ready.pop(name, None)
        else:
            self._not_ready[name] = since
        back = view.ready_since
        if back is None or back < self._ready_floor:
            self._ready.pop(name, None)
        else:
            self._ready[name] = back
        self._place(name)

    def remove_node(self, name: str) -> None:
        """A Kubernetes node vanished (its open record, if any, still counts where it did)."""
        self._nodes.pop(name, None)
        had = self._info.pop(name, None)
        self._paused.pop(name, None)
        self._not_ready.pop(name, None)
        self._ready.pop(name, None)
        if had is not None and had.nodeset:
            self._retag_node(name)  # a vanished node is in no NodeSet
        self._place(name)

    # -- Slurm ------------------------------------------------------------------------------

    def set_slurm(self, node: str, cause: str) -> None:
        """Slurm's view of ``node`` changed: ``cause`` is why Slurm will not start jobs there
        (:func:`healer.core.unavailability.slurm_cause`; "" = it will). O(#policies x #domains)."""
        if cause:
            if self._slurm.get(node) == cause:
                return
            self._slurm[node] = cause
        elif self._slurm.pop(node, None) is None:
            return
        self._place(node)

    def set_slurm_view(self, state: SlurmView) -> None:
        """The Slurm feed is ``off`` (none), ``ok`` or ``unknown`` (cannot be read)."""
        self._slurm_view = state

    def adopt_slurm(self, other: FleetIndex) -> None:
        """Take ``other``'s Slurm view (an index rebuilt from the same fleet)."""
        self._slurm_view = other.slurm_view
        for node, cause in other.slurm.items():
            self.set_slurm(node, cause)

    def _place(self, name: str) -> None:
        """Count ``name`` where it belongs now, and nowhere else."""
        old = self._placed.pop(name, None)
        if old is not None:
            for s in old.scopes:
                self._scopes[s].add(old.view, old.cause, -1)
        info = self._info.get(name)
        if info is None or not info.selected_by:
            return
        cause = self._cause(info)
        if cause is None:
            return
        scopes: tuple[int, ...] = (0, *(i + 1 for i in info.selected_by))
        if info.nodeset:
            scopes = (*scopes, self._ns_scope[info.nodeset])
        for s in scopes:
            self._scopes[s].add(info.view, cause, 1)
        self._placed[name] = Placed(info.view, scopes, cause)

    def _cause(self, info: NodeEntry) -> str | None:
        """Why the node is unavailable ("" = it is not, :data:`REPLACED` = a spare replaced
        it). None: it is in no population (a spare, free or claimed and not yet serving)."""
        if info.spare or info.view.name in self._claimed:
            return None
        v = info.view
        rec = self._open.get(v.name)
        if replaced(rec):
            return REPLACED  # its spare serves in its place
        return unavailable_cause(v, rec, self._slurm.get(v.name, ""))

    # -- records ---------------------------------------------------------------------------

    def set_record(self, rec: NodeRecord) -> None:
        """A record was committed. An open one takes the node's open slot; a closed one
        (:func:`~healer.core.machine.releases`) frees it if it held it. Either stays an
        incident (for the breaker and the retry budgets) until forgotten. A suspicion is
        neither: it drops the node's open record and the incident."""
        if rec.phase is Phase.SUSPECT:
            self.drop_record(rec.node)
            self.forget_incident(rec.incident.id)
            return
        self.add_incident(past_incident(rec))
        if releases(rec):
            held = self._open_incident.get(rec.node)
            if held is None or held == rec.incident.id:
                self.drop_record(rec.node)
        else:
            self.set_open(open_remediation(rec), rec.incident.id)

    def set_open(self, rem: OpenRemediation, incident: str = "") -> None:
        """``rem`` is the open record of its node (replacing any other)."""
        self._unset_open(rem.node)
        self._open[rem.node] = rem
        if incident:
            self._open_incident[rem.node] = incident
        if rem.active:
            self._active[rem.policy] = self._active.get(rem.policy, 0) + 1
            self._active_total += 1
        self._tag_open(rem.node, rem)
        spare = claims_in_flight(rem)
        if spare:
            self._claimed.setdefault(spare, {})[rem.node] = None
            self._place(spare)
        self._place(rem.node)

    def drop_record(self, node: str) -> None:
        """``node`` has no open record any more."""
        if self._unset_open(node):
            self._place(node)

    def _unset_open(self, node: str) -> bool:
        self._open_incident.pop(node, None)
        old = self._open.pop(node, None)
        if old is None:
            return False
        if old.active:
            self._active[old.policy] -= 1
            self._active_total -= 1
        ns = self._open_ns.pop(node, "")
        if ns and old.active:
            self._active_ns[ns] -= 1
        spare = claims_in_flight(old)
        if spare:
            claimers = self._claimed[spare]
            del claimers[node]
            if not claimers:
                del self._claimed[spare]
            self._place(spare)
        return True

    # -- incidents -------------------------------------------------------------------------

    def add_incident(self, inc: PastIncident) -> None:
        """Remember ``inc`` (replacing an incident with its id)."""
        old = self._incidents.get(inc.id)
        if old == inc:
            return
        if old is not None:
            self.forget_incident(inc.id)
        self._incidents[inc.id] = inc
        entry = (inc.opened_at, inc.node, inc.id)
        insort(self._times, entry)
        insort(self._times_by_policy.setdefault(inc.policy, []), entry)
        self._tag_incident(inc)
        self._by_node.setdefault(inc.node, {})[inc.id] = inc
        for serial in set(inc.serials):
            self._by_serial.setdefault(serial, {})[inc.id] = inc

    def forget_incident(self, incident_id: str) -> None:
        """Garbage collection: ``incident_id`` no longer counts for any budget."""
        inc = self._incidents.pop(incident_id, None)
        if inc is None:
            return
        entry = (inc.opened_at, inc.node, inc.id)
        remove_entry(self._times, entry)
        remove_entry(self._times_by_policy[inc.policy], entry)
        if not self._times_by_policy[inc.policy]:
            del self._times_by_policy[inc.policy]
        self._untag_incident(inc)
        drop_incident(self._by_node, inc.node, inc.id)
        for serial in set(inc.serials):
            drop_incident(self._by_serial, serial, inc.id)

    def prune(self, now: float, retention: float) -> list[str]:
        """Forget incidents opened before ``now - retention``, except open records' own.
        Returns the ids forgotten. O(forgotten + old open incidents)."""
        cutoff = now - retention
        keep = set(self._open_incident.values())
        old = [e[2] for e in self._times[:bisect_left(self._times, cutoff, key=entry_time)]
               if e[0] < cutoff and e[2] not in keep]
        for incident_id in old:
            self.forget_incident(incident_id)
        return old

    # -- GuardrailFacts --------------------------------------------------------------------

    def _scope(self, policy: Scope) -> ScopeCounts:
        if policy is None:
            return self._scopes[0]
        if isinstance(policy, NodeSetRules):
            at = self._ns_scope.get(policy.name)
            if at is not None and self._scopes[at].policy == policy:
                return self._scopes[at]
            return self._adhoc(policy)
        for s in self._scope_of.get(policy.name, ()):
            scope = self._scopes[s]
            known = scope.policy
            if known is policy or (known is not None and known.selector == policy.selector):
                return scope
        return self._adhoc(policy)

    def _adhoc(self, policy: Policy | NodeSetRules) -> ScopeCounts:
        """The scope of a policy or NodeSet the index does not know: by a scan, O(fleet).
        The engine only asks about its own."""
        scope = ScopeCounts(policy, ())
        for info in self._info.values():
            cause = self._cause(info)
            if cause is None:
                continue
            if policy.selector.matches(info.view.labels) if isinstance(policy, NodeSetRules) \
                    else policy.applies_to(info.view):
                scope.add(info.view, cause, 1)
        return scope

    def members(self, policy: Scope) -> AbstractSet[str]:
        return self._scope(policy).members

    def population(self, policy: Scope) -> int:
        return len(self._scope(policy).members)

    def unavailable(self, policy: Scope) -> int:
        return len(self._scope(policy).down)

    def is_unavailable(self, policy: Scope, node: str) -> bool:
        return node in self._scope(policy).down

    def domain_unavailable(self, policy: Scope, key: str, value: str) -> int:
        scope = self._scope(policy)
        if key in scope.keys:
            counts = scope.domains.get(key, {}).get(value)
            return counts[1] if counts is not None else 0
        return sum(1 for n in scope.down if self._nodes[n].labels.get(key) == value)

    def causes(self, policy: Scope) -> Mapping[str, int]:
        return self._scope(policy).causes

    def cause(self, policy: Scope, node: str) -> str:
        return self._scope(policy).down.get(node, "")

    def replaced(self, policy: Scope) -> int:
        return len(self._scope(policy).replaced)

    def not_ready(self, policy: Scope,
                  domain: tuple[str, str] | None = None) -> Mapping[str, float]:
        """O(NotReady nodes of the fleet)."""
        members = self._scope(policy).members
        return {n: t for n, t in self._not_ready.items() if n in members and (
            domain is None or self._nodes[n].labels.get(domain[0]) == domain[1])}

    def returned(self, policy: Scope, since: float,
                 domain: tuple[str, str] | None = None) -> Mapping[str, float]:
        """Amortised O(nodes Ready within the longest mass-death window): older entries are
        dropped here (``since`` is at most one such window back, so none is needed again)."""
        members = self._scope(policy).members
        stale = since - self._max_mass_window
        self._ready_floor = max(self._ready_floor, stale)
        out: dict[str, float] = {}
        for n, t in list(self._ready.items()):
            if t < stale:
                del self._ready[n]
            elif t >= since and n in members and (
                    domain is None or self._nodes[n].labels.get(domain[0]) == domain[1]):
                out[n] = t
        return out

    def domain_members(self, policy: Scope, key: str, value: str) -> int:
        scope = self._scope(policy)
        if key in scope.keys:
            counts = scope.domains.get(key, {}).get(value)
            return counts[0] if counts is not None else 0
        return sum(1 for n in scope.members if self._nodes[n].labels.get(key) == value)

    def active(self, policy: Scope, excluding: str | None = None) -> int:
        if isinstance(policy, NodeSetRules):
            n = self._active_ns.get(policy.name, 0)
            mine = self._open.get(excluding) if excluding is not None else None
            if mine is not None and mine.active and self._open_ns.get(mine.node) == policy.name:
                n -= 1
            return n
        n = self._active_total if policy is None else self._active.get(policy.name, 0)
        if excluding is not None:
            mine = self._open.get(excluding)
            if mine is not None and mine.active and (policy is None
                                                     or mine.policy == policy.name):
                n -= 1
        return n

    def has_incident(self, policy: Scope, incident: str) -> bool:
        inc = self._incidents.get(incident)
        if inc is None or policy is None:
            return inc is not None
        if isinstance(policy, NodeSetRules):
            return self._incident_ns.get(incident) == policy.name
        return inc.policy == policy.name

    def breaker_times(self, policy: Scope, since: float,
                      now: float) -> Sequence[tuple[float, str]]:
        if isinstance(policy, NodeSetRules):
            times = self._times_by_ns.get(policy.name, [])
        else:
            times = self._times if policy is None else \
                self._times_by_policy.get(policy.name, [])
        lo = bisect_left(times, since, key=entry_time)
        hi = bisect_right(times, now, key=entry_time)
        return [(t, n) for t, n, _ in times[lo:hi]]

    def incidents_on_node(self, node: str) -> Iterable[PastIncident]:
        return self._by_node.get(node, {}).values()

    def incidents_with_serial(self, serial: str) -> Iterable[PastIncident]:
        return self._by_serial.get(serial, {}).values()
