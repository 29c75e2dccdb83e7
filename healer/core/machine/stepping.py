""":func:`step`, the machine's only entry point, and the queries the runtime asks of a record.

``step(record, trigger, now, view) -> Decision`` never performs I/O: it finds the first row of
:data:`~healer.core.machine.table.TRANSITIONS` whose guard holds, applies its effect, enters its
target, then applies ``auto`` rows until the phase settles. The queries (:func:`releases`,
:func:`counts_as_active`, :func:`record_out_of_service`) read a record the same way everywhere.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

from healer.core.actions import EmitEvent
from healer.core.budget import BudgetView
from healer.core.health import Verdict
from healer.core.intervals import GUARDRAIL_RECHECK, HELD_RETRY, PAUSED_RECHECK
from healer.core.machine.context import Ctx
from healer.core.machine.decisions import Decision
from healer.core.machine.guards import phase_deadline
from healer.core.machine.table import ROWS_BY_PAIR, TransitionRow
from healer.core.machine.triggers import StepResult, Trigger, TriggerKind
from healer.core.model import (
    HISTORY_LIMIT,
    EventRecord,
    HealthState,
    NodeRecord,
    RecordOutcome,
    StepKey,
    StepOutcome,
    TransitionRecord,
)
from healer.core.phases import ACTIVE, TERMINAL, Phase
from healer.core.rules import LabelSelector, Policy
from healer.core.vocabulary import StepName

#: At most this many rows apply in one step (the table has no ``auto`` cycles; tested).
MAX_AUTO_STEPS = 12


def step(record: NodeRecord | None, trigger: Trigger, now: float, view: BudgetView) -> Decision:
    """Advance ``record`` by ``trigger`` at ``now``. Pure: the same inputs give the same output."""
    if record is not None and trigger.node != record.node:
        raise ValueError(f"trigger for {trigger.node} applied to the record of {record.node}")
    phase = record.phase if record is not None else Phase.HEALTHY
    policy = _policy_for(record, trigger.node, view, trigger.verdict)
    if record is not None:
        if trigger.at < record.last_transition:
            return Decision(record, note=f"stale trigger ({trigger.describe()}) dropped")
        if trigger.incident and trigger.incident != record.incident.id:
            return Decision(record, note=f"trigger for another incident ({trigger.incident})")
    ctx = Ctx(record, trigger, now, view, policy)
    if record is not None:
        ctx.record = _absorb(record, trigger, now)
        _note_hold(ctx, record)
        paused = view.is_paused(record.node)
        if paused != record.paused:
            ctx.record = replace(ctx.rec, paused=paused)
        if paused and phase not in TERMINAL:
            return Decision(ctx.record, note="paused: no transition",
                            recheck_after=_recheck(ctx))

    transitions: list[tuple[Phase, Phase, str]] = []
    kind = trigger.kind
    for _ in range(MAX_AUTO_STEPS):
        row = _select(phase, kind, ctx)
        if row is None:
            break
        row.effect(ctx)
        target = row.target
        if target is Phase.HEALTHY:
            ctx.record = None
        if target is not None and target is not phase and ctx.record is not None:
            ctx.record = _enter(ctx.rec, phase, target, now, row.label)
        if target is not None and target is not phase:
            transitions.append((phase, target, row.label))
            phase = target
            kind = TriggerKind.AUTO
            continue
        if kind is TriggerKind.AUTO:
            break
        kind = TriggerKind.AUTO
    else:  # pragma: no cover - the table has no AUTO cycles (tested)
        raise RuntimeError(f"AUTO transitions did not settle for {trigger.node}")

    if (ctx.record is not None and ctx.record.phase is Phase.DONE
            and ctx.record.outcome is None):
        ctx.record = replace(ctx.record, outcome=RecordOutcome.DONE)
    _keep_events(ctx, trigger)
    return Decision(ctx.record, tuple(ctx.actions),
                    _recheck(ctx) if ctx.record is not None else None,
                    tuple(transitions))


def _keep_events(ctx: Ctx, trigger: Trigger) -> None:
    """Events ride with the intent: the record keeps the latest decision's Events, and a
    RESUME re-emits them (a leader that died between the write and the Events loses none;
    Events are idempotent by key, so a repeat is a no-op)."""
    if ctx.record is None:
        return
    rec = ctx.record
    emits = [a for a in ctx.actions if isinstance(a, EmitEvent)]
    if emits:
        kept = tuple(EventRecord(a.reason, a.note, a.type, a.name) for a in emits)
        if kept != rec.events:
            ctx.record = replace(rec, events=kept)
    elif trigger.kind is TriggerKind.RESUME and rec.events:
        ctx.actions.extend(recorded_events(rec))


def recorded_events(record: NodeRecord) -> tuple[EmitEvent, ...]:
    """The Events ``record`` keeps (its latest decision's), as actions to emit again."""
    return tuple(EmitEvent(record.incident.id, record.node, reason=e.reason, note=e.note,
                           type=e.type, name=e.name) for e in record.events)


def _select(phase: Phase, kind: TriggerKind, ctx: Ctx) -> TransitionRow | None:
    for row in ROWS_BY_PAIR.get((phase, kind), ()):
        if row.guard(ctx):
            return row
    return None


def _policy_for(record: NodeRecord | None, node: str, view: BudgetView,
                trigger_verdict: Verdict | None) -> Policy | None:
    if record is not None and record.policy:
        p = view.policies.get(record.policy)
        if p is not None:
            return p
        if record.phase not in (Phase.SUSPECT, Phase.DEGRADING, Phase.FAILED, Phase.DEAD):
            # an in-flight remediation keeps going under the defaults if its policy vanished
            return Policy(name=record.policy, selector=LabelSelector(), rules=(),
                          mode=record.mode)
        return None
    v = trigger_verdict
    if v is not None and v.policy:
        return view.policies.get(v.policy)
    n = view.nodes.get(node)
    return view.policies.for_node(n) if n is not None else None


def _absorb(record: NodeRecord, trigger: Trigger, now: float) -> NodeRecord:
    """Book-keeping every trigger does before the table: verdicts and step outcomes."""
    if trigger.kind is TriggerKind.VERDICT and trigger.verdict is not None \
            and trigger.verdict.state is not record.verdict:
        # verdictAt: since when the verdict holds (a repeated verdict changes nothing, so it
        # costs no write)
        record = replace(record, verdict=trigger.verdict.state, verdict_at=trigger.verdict.at)
    r = trigger.result
    if trigger.kind is TriggerKind.STEP and r is not None:
        s = record.step(r.step)
        if s is not None and not s.done and r.status is not StepOutcome.PENDING:
            # the ledger records "no spare that fits" as failed; RETRY leaves the step open
            outcome = {StepOutcome.DONE: StepOutcome.DONE, StepOutcome.FAILED: StepOutcome.FAILED,
                       StepOutcome.UNAVAILABLE: StepOutcome.FAILED}.get(r.status)
            if outcome is not None:
                record = record.with_step(replace(s, finished_at=now, outcome=outcome,
                                                  error=r.error, detail=_detail(r)))
            else:  # RETRY: keep the step open, remember the error
                record = record.with_step(replace(s, error=r.error))
        elif s is not None and not s.done and r.error and r.error != s.error:
            # PENDING with a reason (e.g. "held: drained by someone else"): kept on the open
            # step so `healer status` shows why it waits; an unchanged reason costs no write
            record = record.with_step(replace(s, error=r.error))
        slurm_node = r.get(StepKey.SLURM_NODE)
        if slurm_node and slurm_node != record.slurm_node:
            record = replace(record, slurm_node=slurm_node)
        carried = r.get(StepKey.CARRIED)[:250]  # the move carried someone's reason over (ADR 0016)
        if r.step == StepName.MOVE_WORKLOAD and carried and carried != record.carried:
            record = replace(record, carried=carried)
    return record


def _note_hold(ctx: Ctx, before: NodeRecord) -> None:
    """A step that says it is *held* (its result's ``held`` data: e.g. the swap of a node
    someone else drained, docs/adr/0006) gets a Warning Event saying why, once per reason (the
    reason itself is kept on the open step, where ``status.reason`` shows it)."""
    r = ctx.trigger.result
    if r is None or r.status is not StepOutcome.PENDING or not r.get(StepKey.HELD) or not r.error:
        return
    s = before.step(r.step)
    if s is None or s.done or s.error == r.error:
        return
    ctx.event(f"held-{r.step}-{zlib.crc32(r.error.encode()):08x}", "StepHeld",
              f"{r.step} held: {r.error}", warning=True)


def _detail(r: StepResult) -> str:
    return ",".join(f"{k}={v}" for k, v in r.data if k != StepKey.SLURM_NODE)


def _enter(rec: NodeRecord, source: Phase, target: Phase, now: float, label: str) -> NodeRecord:
    hist = (*rec.history, TransitionRecord(now, source, target, label))
    if len(hist) > HISTORY_LIMIT:
        hist = hist[-HISTORY_LIMIT:]
    return replace(rec, phase=target, phase_since=now, history=hist)


def _recheck(ctx: Ctx) -> float | None:
    rec = ctx.record
    if rec is None:
        return None
    phase = rec.phase
    st = ctx.steps
    candidates: list[float] = []
    if phase in TERMINAL:
        return st.poll_interval if any(not s.done for s in rec.ledger) else None
    d = phase_deadline(rec, ctx.policy)
    if d is not None:
        candidates.append(max(d - ctx.now, 0.0))
    if ctx.backoff is not None:
        return min([ctx.backoff, *candidates])
    if phase is Phase.HELD_FOR_CAPACITY and not any(not s.done for s in rec.ledger):
        # a spare appearing wakes it (a CAPACITY trigger); the tick is only a backstop, so a
        # fleet with many nodes held does not ask the spare pool every poll
        candidates.append(max(st.poll_interval, HELD_RETRY))
    elif phase is Phase.HELD_FOR_FENCING:
        # a provider saying so changes the Node (an annotation, a taint, its deletion), which
        # wakes it (a NODE trigger); the tick is only a backstop
        candidates.append(max(st.poll_interval, HELD_RETRY))
    elif phase is Phase.DEAD and rec.step(StepName.FENCE) is not None:
        candidates.append(st.poll_interval)
    elif phase in (Phase.DEGRADING, Phase.FAILED, Phase.DEAD):
        adm = ctx.checked_admission
        if adm is not None and adm.recheck_after is not None:
            candidates.append(adm.recheck_after)
        elif rec.blocked is not None:
            candidates.append(GUARDRAIL_RECHECK)
    elif phase is not Phase.SUSPECT:
        candidates.append(st.poll_interval)
    if ctx.view.is_paused(rec.node):
        candidates.append(PAUSED_RECHECK)
    return min(candidates) if candidates else None


def releases(record: NodeRecord) -> bool:
    """May the runtime take ``record`` off its node, so a new incident can open there?

    Done releases at once. Escalated and Cancelled hold the node until its verdict is healthy
    again: a human is handling it, and healer must not reopen (and re-cordon) a node an admin
    just took back. Open ledger steps (an undo in flight) always hold it.
    """
    phase = record.phase
    if phase not in TERMINAL or any(not s.done for s in record.ledger):
        return False
    return phase is Phase.DONE or record.verdict is HealthState.HEALTHY


def counts_as_active(record: NodeRecord) -> bool:
    """Does ``record`` hold a ``maxConcurrent`` slot? Admitted and not yet giving back (a
    dead node once its fencing was asked for)."""
    admitted = record.phase in ACTIVE or (record.phase is Phase.DEAD
                                          and record.step(StepName.FENCE) is not None)
    return admitted and not record.repaired


def record_out_of_service(record: NodeRecord) -> bool:
    """Does healer hold ``record``'s node out of service (for the guardrails)?"""
    phase = record.phase
    if phase in (Phase.DONE, Phase.CANCELLED):
        return False
    took = record.step_ok(StepName.DRAIN) or record.step_ok(StepName.CORDON)
    undone = record.step_ok(StepName.UNDO_DRAIN) and record.step_ok(StepName.UNCORDON)
    if phase is Phase.REPAIR and record.spare:
        return False  # replaced: out of the fleet entirely
    return took and not undone


