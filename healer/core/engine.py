"""The engine: signals in → evaluation only where something changed → ``step()`` → decisions
and the next wake-ups. Synchronous and pure; the one loop every driver runs.

The daemon (:mod:`healer.runtime.controller`: async, persistence, leadership), ``healer
simulate`` (:mod:`healer.sim.engine`: a simulated clock and world) and ``healer backtest`` (a
history reader on top of the simulator) all drive this class; each adds only its I/O. A driver:

1. tells the engine about nodes (:meth:`Engine.set_node`, :meth:`Engine.remove_node`) and
   signals (:meth:`Engine.ingest`, which returns the nodes worth evaluating now);
2. evaluates a node when asked (:meth:`Engine.evaluate`): a verdict trigger when a step is
   needed, plus when to evaluate again if nothing arrives;
3. steps a node (:meth:`Engine.decide`), persists the decision if it must, then commits it
   (:meth:`Engine.commit`) and runs its actions;
4. arms one timer per node for the next tick (:meth:`Engine.next_tick`).

Cost follows change: a signal that cannot change a verdict (a heartbeat, a sample equal to the
previous one) wakes nothing; guardrails read an incrementally maintained
:class:`~healer.core.capacity.FleetIndex` (no fleet scan per decision); an open remediation
whose only way forward is a new verdict or an event (held by observe-only mode, in repair
waiting for a result) sleeps until its deadline instead of ticking. State per node is bounded
(:class:`~healer.core.signals.NodeSignals`): nothing grows with uptime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from healer.core.budget import BudgetView
from healer.core.capacity import FleetIndex
from healer.core.health import Verdict, evaluate_node
from healer.core.machine import (
    Decision,
    Trigger,
    TriggerKind,
    counts_as_active,
    phase_deadline,
    record_out_of_service,
    releases,
    step,
)
from healer.core.model import Guardrail, HealthState, NodeRecord, NodeView, Signal, SignalKind
from healer.core.phases import PENDING_ADMISSION, Phase
from healer.core.rules import Policy, PolicySet
from healer.core.signals import NodeSignals, RuleIndex
from healer.core.verdict_gpus import with_gpu_identity

#: The shortest wait between two evaluations or ticks of one node (seconds).
MIN_WAIT = 0.05


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What :meth:`Engine.evaluate` found."""

    verdict: Verdict | None  # None: the node is unknown (no Kubernetes node of that name)
    trigger: Trigger | None  # a VERDICT trigger when the machine must see it
    recheck_at: float | None  # evaluate again then if nothing else arrives
    previous: HealthState | None = None  # the state the previous evaluation found

    @property
    def changed(self) -> bool:
        return self.verdict is not None and self.verdict.state is not self.previous


def takes_capacity(before: NodeRecord | None, decision: Decision) -> bool:
    """Does ``decision`` open an incident or take capacity (a ``maxConcurrent`` slot, a node
    out of service)? Those are checked against the guardrails and recorded atomically."""
    new = decision.record
    if new is None or new.phase is Phase.SUSPECT:
        return False
    if before is None or before.phase is Phase.SUSPECT:
        return True
    return (counts_as_active(new) and not counts_as_active(before)) or (
        record_out_of_service(new) and not record_out_of_service(before))


def observe_held(rec: NodeRecord) -> bool:
    """An incident held back only because its policy observes: only a new verdict or a policy
    change can move it."""
    return rec.phase in PENDING_ADMISSION and rec.blocked is not None \
        and rec.blocked.guardrail is Guardrail.OBSERVE_ONLY


class Engine:
    """One fleet's health and remediation state, advanced by the driver (module docstring)."""

    def __init__(self, policies: PolicySet, *, paused: bool = False,
                 gap: float | None = None) -> None:
        self.policies = policies
        self.paused = paused
        self.gap = gap
        self.rules = RuleIndex.of(policies)
        self.fleet = FleetIndex(policies)
        self.signals: dict[str, NodeSignals] = {}
        self.last_state: dict[str, HealthState] = {}
        self.records: dict[str, NodeRecord] = {}  # open records by node (suspicions too)
        self.history: dict[str, NodeRecord] = {}  # every kept incident by id, open or closed
        self.evaluations = 0
        self.decisions = 0
        self._selecting: dict[str, list[Policy]] = {}

    # -- configuration -------------------------------------------------------------------------

    def set_policies(self, policies: PolicySet) -> list[str]:
        """A policy reload. Returns the nodes to evaluate again (every open record's node: a
        mode or guardrail change may free what was held)."""
        self.policies = policies
        self.rules = RuleIndex.of(policies)
        for store in self.signals.values():
            store.index = self.rules
        self.fleet.set_policies(policies)
        self._selecting.clear()
        return sorted(self.records)

    # -- nodes ---------------------------------------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, NodeView]:
        return self.fleet.nodes

    def set_node(self, view: NodeView) -> bool:
        """A node appeared or changed; True when its labels changed (policies may differ)."""
        prev = self.fleet.nodes.get(view.name)
        self.fleet.set_node(view)
        relabelled = prev is None or prev.labels != view.labels
        if relabelled:
            self._selecting.pop(view.name, None)
        return relabelled

    def remove_node(self, name: str) -> None:
        self.fleet.remove_node(name)
        self._selecting.pop(name, None)

    def policies_for(self, node: str) -> list[Policy]:
        found = self._selecting.get(node)
        if found is None:
            view = self.fleet.nodes.get(node)
            found = self.policies.policies_for(view) if view is not None else []
            self._selecting[node] = found
        return found

    # -- signals -------------------------------------------------------------------------------

    def store(self, node: str) -> NodeSignals:
        s = self.signals.get(node)
        if s is None:
            s = self.signals[node] = NodeSignals(self.rules, self.gap)
        return s

    def ingest(self, signals: Iterable[Signal]) -> set[str]:
        """Remember ``signals``; return the nodes whose verdict they may change.

        A heartbeat wakes only a node never evaluated or last seen stale; another signal wakes
        its node when it is new information, and always while the node's incident waits for
        admission (each verdict re-checks the guardrails then).
        """
        woken: set[str] = set()
        last_state = self.last_state
        for sig in signals:
            node = sig.node
            changed = self.store(node).add(sig)
            if node in woken:
                continue
            last = last_state.get(node)
            if sig.kind is SignalKind.FRESH:
                wake = last is None or last is HealthState.STALE
            else:
                wake = changed or last is None or self.awaits_verdicts(node)
            if wake:
                woken.add(node)
        return woken

    def seed(self, record: NodeRecord) -> None:
        """Re-seed what cannot be observed again (the events that opened an incident). Slurm's
        findings are read again by the Slurm feed (a seeded one could outlive its drain)."""
        self.store(record.node).extend(s for s in record.incident.evidence
                                       if s.kind is not SignalKind.SLURM)

    def awaits_verdicts(self, node: str) -> bool:
        rec = self.records.get(node)
        return rec is not None and rec.phase in PENDING_ADMISSION \
            and not observe_held(rec)

    # -- evaluation ----------------------------------------------------------------------------

    def verdict(self, node: str, now: float) -> Verdict:
        self.evaluations += 1
        store = self.signals.get(node)
        signals = store.signals(now) if store is not None else []
        return with_gpu_identity(evaluate_node(node, signals, self.policies_for(node), now),
                                 signals)

    def evaluate(self, node: str, now: float, *, hold_healthy: bool = False) -> Evaluation:
        """Evaluate ``node``; a VERDICT trigger when the state machine has to see it.

        ``hold_healthy``: a healthy verdict does not reach an open incident now (a new leader
        has not yet seen again the telemetry that opened it); the state is forgotten so the
        next evaluation reports it.
        """
        if node not in self.fleet.nodes:
            return Evaluation(None, None, None)
        v = self.verdict(node, now)
        prev = self.last_state.get(node)
        self.last_state[node] = v.state
        recheck = None if v.recheck_after is None else now + max(v.recheck_after, MIN_WAIT)
        rec = self.records.get(node)
        if prev is v.state and rec is None and v.state in (HealthState.HEALTHY,
                                                            HealthState.STALE):
            return Evaluation(v, None, recheck, prev)
        if rec is not None and v.state is HealthState.HEALTHY and hold_healthy:
            self.last_state.pop(node, None)
            return Evaluation(v, None, recheck, prev)
        return Evaluation(v, Trigger(TriggerKind.VERDICT, node, now, verdict=v), recheck, prev)

    # -- steps ---------------------------------------------------------------------------------

    def view(self, *, paused: bool | None = None) -> BudgetView:
        """What the guardrails see now: O(1), backed by the incremental fleet index."""
        return self.fleet.view(paused=self.paused if paused is None else paused)

    def decide(self, node: str, trigger: Trigger, now: float,
               view: BudgetView | None = None) -> Decision:
        """One step of ``node``'s state machine. Nothing is changed until :meth:`commit`."""
        self.decisions += 1
        return step(self.records.get(node), trigger, now, view or self.view())

    def commit(self, node: str, decision: Decision) -> None:
        """Make ``decision`` (persisted by the driver if it had to be) the node's state."""
        new = decision.record
        if new is None:
            if self.records.pop(node, None) is not None:
                self.fleet.drop_record(node)
            return
        if new.phase is Phase.SUSPECT:
            self.records[node] = new  # a suspicion is not an incident: guardrails ignore it
            return
        self.history[new.incident.id] = new
        self.fleet.set_record(new)
        if releases(new):
            self.records.pop(node, None)
        else:
            self.records[node] = new

    def load(self, records: Iterable[NodeRecord], *, keep_closed_since: float) -> None:
        """Start from persisted records (a new leader): the newest open record per node is its
        state, closed ones opened since ``keep_closed_since`` count for breakers and budgets."""
        self.records.clear()
        self.history.clear()
        nodes = list(self.fleet.nodes.values())
        old, self.fleet = self.fleet, FleetIndex(self.policies)
        for view in nodes:
            self.fleet.set_node(view)
        self.fleet.adopt_slurm(old)  # Slurm's view is the feed's, not the records'
        for rec in sorted(records, key=lambda r: r.incident.opened_at):
            closed = releases(rec)
            if not closed or rec.incident.opened_at >= keep_closed_since:
                self.history[rec.incident.id] = rec
                self.fleet.set_record(rec)
            if not closed:
                self.records[rec.node] = rec
                self.seed(rec)

    def forget(self, incident: str) -> None:
        """A closed record was deleted (retention): it no longer counts anywhere."""
        self.history.pop(incident, None)
        self.fleet.forget_incident(incident)

    def next_tick(self, node: str, decision: Decision, now: float) -> float | None:
        """When the node's record should next be ticked (None: only events move it)."""
        rec = decision.record
        if rec is None or decision.recheck_after is None:
            return None
        t = now + max(decision.recheck_after, MIN_WAIT)
        if observe_held(rec):
            return None  # only a new verdict or a policy change moves it
        if rec.phase is Phase.REPAIR and all(s.done for s in rec.ledger) \
                and not self.policies.fleet.paused and not self.paused:
            deadline = phase_deadline(rec, self.policies.get(rec.policy))
            if deadline is None:
                return None  # waits for a repair result (an event)
            t = max(t, deadline)
        return t
