"""What happened during a replay, collected and turned into the :class:`Report`.

:class:`Collector` is the engine's ``on_step`` hook: every incident's phase changes, the
guardrail blocks it met (which guardrail, with its numbers, from when to when) and the breaker
trips. :func:`build_report` reads those, the records' ledgers (drain, cordon, spare, undrain
times) and the optimistic world's spare pool into the per-node and fleet report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from healer.backtest.report import (
    Assumptions,
    Block,
    BreakerTrip,
    Disruption,
    IncidentReport,
    NodeReport,
    PhaseChange,
    PolicyMode,
    Report,
    StalePeriod,
    StepEntry,
    Summary,
)
from healer.backtest.world import BacktestWorld
from healer.core.budget import BudgetView, breaker_status, population
from healer.core.fleet import past_incident
from healer.core.machine import Decision, Trigger
from healer.core.model import HealthState, NodeRecord, NodeView, StepOutcome
from healer.core.phases import PENDING_ADMISSION, Phase
from healer.core.rules import Mode, Policy, PolicySet
from healer.core.topology import match_level
from healer.sim.world import Latencies

_DISRUPTIVE_STEPS = ("drain", "cordon", "requeue")
_GIVE_BACK_STEPS = ("undrain", "undo-drain")
#: Per node, every change of its health state: (time, state, the verdict's summary).
VerdictLog = Mapping[str, Sequence[tuple[float, HealthState, str]]]


@dataclass
class _Incident:
    """One incident as the collector follows it (its latest record, phases, blocks)."""

    id: str
    node: str
    opened_at: float
    record: NodeRecord
    phases: list[PhaseChange] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    open_block: Block | None = None
    escalated_at: float | None = None
    held: bool = False


class Collector:
    """The ``on_step`` hook: phase changes, blocks and breaker trips of every incident."""

    def __init__(self) -> None:
        self.incidents: dict[str, _Incident] = {}
        self.trips: list[BreakerTrip] = []

    def __call__(self, now: float, before: BudgetView, record: NodeRecord | None,
                 trigger: Trigger, decision: Decision) -> None:
        after = decision.record
        rec = after if after is not None else record
        if rec is None:
            return
        inc = self.incidents.get(rec.incident.id)
        for src, dst, label in decision.transitions:
            if inc is None and dst in PENDING_ADMISSION and after is not None:
                inc = self.incidents[rec.incident.id] = _Incident(rec.incident.id, rec.node,
                                                                  now, after)
                self._breaker(now, before, after)
            if inc is None:
                continue
            inc.phases.append(PhaseChange(now, src.value, dst.value, label))
            if dst is Phase.ESCALATED and inc.escalated_at is None:
                inc.escalated_at = now
            if dst is Phase.HELD_FOR_CAPACITY:
                inc.held = True
        if inc is None:
            return
        if after is not None:
            inc.record = after
        blocked = after.blocked if after is not None else None
        cur = inc.open_block
        if blocked is None:
            if cur is not None:
                inc.blocks.append(replace(cur, until=now))
                inc.open_block = None
        elif cur is None or cur.guardrail != blocked.guardrail:
            if cur is not None:
                inc.blocks.append(replace(cur, until=now))
            inc.open_block = Block(blocked.guardrail, blocked.message, blocked.current,
                                   blocked.limit, now, None)

    def _breaker(self, now: float, before: BudgetView, rec: NodeRecord) -> None:
        ps = before.policies
        policy = ps.get(rec.policy)
        scopes: list[tuple[str, Policy | None]] = []
        if policy is not None and policy.guardrails.breaker is not None:
            scopes.append((f"policy {policy.name}", policy))
        if ps.fleet.guardrails.breaker is not None:
            scopes.append(("fleet", None))
        new = past_incident(rec)
        for scope, pol in scopes:
            cfg = (pol.guardrails if pol is not None else ps.fleet.guardrails).breaker
            assert cfg is not None
            members = len(population(before, pol))
            incidents = [i for i in before.incidents if pol is None or i.policy == pol.name]
            was = breaker_status(cfg, incidents, members, now)
            now_st = breaker_status(cfg, [*incidents, new], members, now)
            if now_st.tripped and not was.tripped:
                self.trips.append(BreakerTrip(now, scope, rec.node, now_st.count,
                                              now_st.threshold, now_st.until))
            elif now_st.tripped:
                for i in range(len(self.trips) - 1, -1, -1):
                    if self.trips[i].scope == scope:
                        self.trips[i] = replace(self.trips[i], closes_at=now_st.until)
                        break


def _steps(rec: NodeRecord) -> tuple[StepEntry, ...]:
    return tuple(StepEntry(s.step, s.started_at, s.finished_at,
                           s.outcome.ledger_word if s.outcome is not None else "open", s.detail,
                           s.error) for s in rec.ledger)


def _ok_at(rec: NodeRecord, *names: str) -> float | None:
    times = [s.finished_at for s in rec.ledger
             if s.step in names and s.outcome is StepOutcome.DONE and s.finished_at is not None]
    return min(times) if times else None


def _incident_report(inc: _Incident, world: BacktestWorld, end: float) -> IncidentReport:
    rec = inc.record
    admitted = next((p.at for p in inc.phases if p.source in (Phase.DEGRADING.value,
                                                              Phase.FAILED.value)
                     and p.target in (Phase.CHECKPOINTING.value, Phase.DRAINING.value)), None)
    drained = _ok_at(rec, "drain")
    cordoned = _ok_at(rec, "cordon")
    out_since = drained if drained is not None else cordoned
    out_until = None
    if out_since is not None:
        back = [s.finished_at for s in rec.ledger if s.step in _GIVE_BACK_STEPS
                and s.outcome is StepOutcome.DONE and s.finished_at is not None
                and s.finished_at >= out_since]
        out_until = min(back) if back else None
    spare_match = ""
    replaced = None
    if rec.spare and rec.spare in world.nodes and rec.node in world.nodes:
        spare_match = match_level(world.nodes[rec.node].view(end), world.nodes[rec.spare].view(end))
        replaced = _ok_at(rec, "undrain")
    blocks = list(inc.blocks)
    if inc.open_block is not None:
        blocks.append(inc.open_block)
    return IncidentReport(
        id=inc.id, node=inc.node, policy=rec.policy, mode=rec.mode.value,
        severity=rec.incident.severity.label, rules=rec.incident.rules, gpus=rec.incident.gpus,
        summary=rec.incident.summary, opened_at=inc.opened_at, phase=rec.phase.value,
        outcome=rec.outcome_text, admitted_at=admitted, drained_at=drained, cordoned_at=cordoned,
        spare=rec.spare, spare_match=spare_match, replaced_at=replaced, out_since=out_since,
        out_until=out_until, blocks=tuple(blocks), escalated_at=inc.escalated_at,
        escalation=rec.outcome_text if inc.escalated_at is not None else "",
        held_for_capacity=inc.held, phases=tuple(inc.phases), steps=_steps(rec))


def _stale_periods(log: Sequence[tuple[float, HealthState, str]]) -> tuple[StalePeriod, ...]:
    out: list[StalePeriod] = []
    for i, (t, state, summary) in enumerate(log):
        if state is HealthState.STALE:
            until = log[i + 1][0] if i + 1 < len(log) else None
            out.append(StalePeriod(t, until, summary))
    return tuple(out)


def _peak(changes: Iterable[tuple[float, int]]) -> tuple[int, float | None]:
    cur = best = 0
    at: float | None = None
    for t, d in sorted(changes, key=lambda c: (c[0], c[1])):  # gives back before taking
        cur += d
        if cur > best:
            best, at = cur, t
    return best, at


def build_report(verdict_log: VerdictLog, world: BacktestWorld, collector: Collector,
                 configured: PolicySet, evaluated: PolicySet, n_signals: int,
                 seen: Sequence[str], labels_of: Mapping[str, Mapping[str, str]], *,
                 start: float, end: float, step: float,
                 spares: int | None, as_configured: bool, latencies: Latencies,
                 repair_after: float | None, source: str, label_source: str) -> Report:
    """The report of a replay that ran to ``end``: per node (every node in ``labels_of``)
    its incidents, disruptions and stale stretches; the fleet summary; the assumptions."""
    incidents = [_incident_report(inc, world, end) for inc in collector.incidents.values()]
    by_node: dict[str, list[IncidentReport]] = defaultdict(list)
    for i in incidents:
        by_node[i.node].append(i)
    telemetry = set(seen)
    node_reports: list[NodeReport] = []
    governed = 0
    spare_sel = evaluated.fleet.spare_selector
    for name in sorted(labels_of):
        view = NodeView(name, labels_of[name])
        is_spare = bool(spare_sel.match_labels or spare_sel.match_expressions) \
            and spare_sel.matches(view.labels)
        selecting = tuple(p.name for p in evaluated.policies_for(view)) if not is_spare else ()
        governed += 1 if selecting else 0
        mine = sorted(by_node.get(name, []), key=lambda i: (i.opened_at, i.id))
        disruptions = sorted(
            (Disruption(s.finished_at, s.step, i.id) for i in mine for s in i.steps
             if s.step in _DISRUPTIVE_STEPS and s.outcome == StepOutcome.DONE.ledger_word
             and s.finished_at is not None), key=lambda d: (d.at, d.action))
        node_reports.append(NodeReport(name, selecting, name in telemetry, tuple(mine),
                                       tuple(disruptions),
                                       _stale_periods(verdict_log.get(name, []))))
    acting = [i for i in incidents if i.mode == Mode.ACT.value]
    out_changes: list[tuple[float, int]] = []
    for i in acting:
        if i.out_since is not None:
            out_changes.append((i.out_since, 1))
            if i.out_until is not None:
                out_changes.append((i.out_until, -1))
    max_out, max_at = _peak(out_changes)
    real = {i.id for i in acting}  # a dryRun incident only pretends to claim a spare
    pool = [(t, d) for t, d, inc in world.pool_changes if inc in real]
    needed, _ = _peak(pool)
    sev: dict[str, int] = defaultdict(int)
    blocks: dict[str, int] = defaultdict(int)
    for i in incidents:
        sev[i.severity] += 1
        for b in {b.guardrail for b in i.blocks}:
            blocks[b] += 1
    summary = Summary(
        nodes=len(node_reports), governed=governed, incidents=len(incidents),
        by_severity=dict(sev),
        nodes_taken_out=len({i.node for i in acting if i.taken_out}),
        max_concurrently_out=max_out, max_out_at=max_at,
        spares_claimed=sum(1 for _, d in pool if d > 0), spares_needed=needed,
        held_for_capacity=sum(1 for i in incidents if i.held_for_capacity),
        breaker_trips=tuple(collector.trips), blocks=dict(blocks),
        escalations=sum(1 for i in incidents if i.escalated_at is not None),
        recovered=sum(1 for i in incidents if i.outcome == "recovered"),
        stale_nodes=sum(1 for n in node_reports if n.stale),
        dry_run_incidents=sum(1 for i in incidents if i.mode == Mode.DRY_RUN.value))
    modes = tuple(PolicyMode(p.name, p.mode.value, (evaluated.get(p.name) or p).mode.value)
                  for p in configured.policies)
    return Report(source=source, start=start, end=end, step=step, policies=modes,
                  as_configured=as_configured,
                  assumptions=Assumptions(latencies, spares, repair_after),
                  nodes=tuple(node_reports), summary=summary, signals=n_signals,
                  digest=configured.digest, label_source=label_source)


# ---------------------------------------------------------------------------------------------
