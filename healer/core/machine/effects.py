"""The effects of the transition table: what a row does to the record and which actions it emits.

Each :class:`Effect` is named (the name is what ``docs/workflow.md`` prints). Effects only change
``ctx.record`` and append to ``ctx.actions``; a ledgered action records its intent through
:meth:`Ctx.issue` in the same call, so the runtime can persist the record before acting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from healer.core.actions import (
    Action,
    AnnotateTopology,
    AwaitReplacement,
    Checkpoint,
    ClaimSpare,
    ClearOutOfService,
    Cordon,
    DrainSlurm,
    EmitEvent,
    Escalate,
    Fence,
    LostJobs,
    MarkRepair,
    MoveWorkload,
    ObserveSlurm,
    ReleaseSpare,
    RequeueJobs,
    ReturnToPool,
    TaintOutOfService,
    Uncordon,
    UndrainSlurm,
    Validate,
)
from healer.core.health import Verdict
from healer.core.intervals import MAX_BACKOFF
from healer.core.machine.context import Ctx, Effect
from healer.core.machine.triggers import REPAIR_NO_FAULT, TriggerKind
from healer.core.model import (
    EVIDENCE_LIMIT,
    Guardrail,
    GuardrailBlock,
    Incident,
    NodeRecord,
    RecordOutcome,
    Severity,
    StepKey,
    StepOutcome,
)
from healer.core.phases import Phase
from healer.core.rules import ForeignReason, Policy
from healer.core.topology import placement_of
from healer.core.vocabulary import SLURM_REASON_PREFIX, StepName


def incident_id(node: str, at: float) -> str:
    """The id of an incident opened on ``node`` at ``at``: the node and a UTC timestamp."""
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{node}-{stamp}"


def new_record(node: str, policy: Policy, now: float, v: Verdict) -> NodeRecord:
    """The record of a node whose verdict just turned: Suspect, with its incident drafted."""
    inc = Incident(id=incident_id(node, now), node=node, opened_at=now,
                   severity=v.severity or Severity.DEGRADING, rules=v.rules or tuple(
                       m.rule for m in v.matches), gpus=v.gpus, summary=v.summary())
    return NodeRecord(node=node, incident=inc, policy=policy.name, phase=Phase.SUSPECT,
                      phase_since=now, mode=policy.mode,
                      verdict=v.state, verdict_at=v.at)


def _reason(rec: NodeRecord) -> str:
    """The drain reason: what is wrong, then ``[incident-id]`` (always kept whole: undrain and
    the Slinky driver find healer's incident in it)."""
    tail = f" [{rec.incident.id}]"
    summary = rec.incident.summary or ",".join(rec.incident.rules)
    room = max(250 - len(SLURM_REASON_PREFIX) - len(tail), 0)
    if len(summary) > room:
        summary = summary[:max(room - 1, 0)] + "…"
    return f"{SLURM_REASON_PREFIX}{summary}{tail}"


def build_action(ctx: Ctx, ledger_name: str) -> Action:
    """The action that (re)runs ``ledger_name`` for the current record."""
    rec = ctx.rec
    inc, node, st = rec.incident.id, rec.node, ctx.steps
    match ledger_name:
        case StepName.CHECKPOINT:
            cp = st.checkpoint
            return Checkpoint(inc, node, hook=cp.hook, signal=cp.signal,
                              slurm_node=rec.slurm_node, url=cp.url, secret_ref=cp.secret_ref,
                              job_template=cp.job_template)
        case StepName.DRAIN:
            return DrainSlurm(inc, node, slurm_node=rec.slurm_node, reason=_reason(rec))
        case StepName.REQUEUE:
            return RequeueJobs(inc, node, slurm_node=rec.slurm_node)
        case StepName.CORDON:
            return Cordon(inc, node, reason=_reason(rec))
        case StepName.CLAIM_SPARE:
            return ClaimSpare(inc, node, same_domain=st.swap.require_same_domain,
                              labels=rec.death.labels if rec.death is not None else ())
        case StepName.MOVE_WORKLOAD:
            return MoveWorkload(inc, node, spare=rec.spare, slurm_node=rec.slurm_node,
                                dead=rec.death is not None,
                                carry=st.swap.foreign_reason is ForeignReason.CARRY_OVER)
        case StepName.AWAIT_REPLACEMENT:
            return AwaitReplacement(inc, node, spare=rec.spare, slurm_node=rec.slurm_node,
                                    carry=rec.carried)
        case StepName.ANNOTATE_TOPOLOGY:
            return AnnotateTopology(inc, node, target=rec.spare or node, slurm_node=rec.slurm_node)
        case StepName.VALIDATE_REPLACEMENT:
            return Validate(inc, node, target=rec.spare or node, image=st.validation.image,
                            command=st.validation.command, purpose="replacement")
        case StepName.VALIDATE_REPAIRED:
            return Validate(inc, node, target=node, image=st.validation.image,
                            command=st.validation.command, purpose="repaired")
        case StepName.UNDRAIN:
            return UndrainSlurm(inc, node, target=rec.spare or node, slurm_node=rec.slurm_node)
        case StepName.UNDO_DRAIN:
            return UndrainSlurm(inc, node, target=node, slurm_node=rec.slurm_node, purpose="undo")
        case StepName.UNCORDON:
            return Uncordon(inc, node)
        case StepName.RELEASE_SPARE:
            return ReleaseSpare(inc, node, spare=rec.spare)
        case StepName.MARK_REPAIR:
            return MarkRepair(inc, node, hook=st.repair.hook, url=st.repair.url,
                              secret_ref=st.repair.secret_ref,
                              job_template=st.repair.job_template)
        case StepName.RETURN_TO_POOL:
            return ReturnToPool(inc, node)
        case StepName.ESCALATE:
            return Escalate(inc, node, reason=rec.outcome_text or RecordOutcome.ESCALATED.value)
        case StepName.LOST_JOBS:
            return LostJobs(inc, node, slurm_node=rec.slurm_node)
        case StepName.FENCE:
            fencing = ctx.policy.dead.fencing if ctx.policy is not None else None
            started = rec.step(StepName.FENCE)
            at = started.started_at if started is not None else ctx.now
            if fencing is None:
                return Fence(inc, node)
            return Fence(inc, node, providers=tuple(sorted(p.value for p in fencing.providers)),
                         url=fencing.url, secret_ref=fencing.secret_ref,
                         deadline=at + fencing.deadline)
        case StepName.OUT_OF_SERVICE:
            return TaintOutOfService(inc, node)
        case StepName.CLEAR_OUT_OF_SERVICE:
            return ClearOutOfService(inc, node)
    raise KeyError(ledger_name)


def issue_steps(*steps: str, reopen: bool = False) -> Effect:
    """Issue the named ledger steps (``reopen``: try a finished step again, one ledger entry)."""
    def apply(ctx: Ctx) -> None:
        for s in steps:
            ctx.issue(build_action(ctx, s), reopen=reopen)
    return Effect(("retry " if reopen else "issue ") + ", ".join(steps), apply)


def _moved(ctx: Ctx) -> None:
    """The slurmd moved: say which reason it carried over (if any), then wait for it."""
    if ctx.rec.carried:
        ctx.event("carried", "ReasonCarriedOver",
                  f"someone else's Slurm reason {ctx.rec.carried!r} is carried over to the "
                  "replacement (steps.swap.foreignReason: carryOver)")
    ctx.issue(build_action(ctx, StepName.AWAIT_REPLACEMENT))


MOVED = Effect("issue await-replacement (with a carried reason)", _moved)


def _noop(ctx: Ctx) -> None:
    return None


NOTHING = Effect("nothing", _noop)


def _poll(ctx: Ctx) -> None:
    """Re-issue every open step (same attempt: a poll, not a retry)."""
    for s in ctx.open_steps():
        ctx.issue(build_action(ctx, s.step))


POLL = Effect("poll open steps", _poll)


def _retry(ctx: Ctx) -> None:
    """Count the failed attempt; the step stays open and is re-issued by the TICK that the
    backoff schedules (poll interval doubling per attempt, capped)."""
    r = ctx.result
    assert r is not None
    s = ctx.rec.step(r.step)
    assert s is not None
    ctx.record = ctx.rec.with_step(replace(s, attempts=s.attempts + 1))
    ctx.backoff = min(ctx.steps.poll_interval * 2 ** (s.attempts - 1), MAX_BACKOFF)


RETRY = Effect("count attempt, retry after backoff", _retry)


def _open_incident(ctx: Ctx) -> None:
    v = ctx.trigger.verdict
    assert v is not None
    assert v.severity is not None
    assert ctx.policy is not None
    node = ctx.trigger.node
    if ctx.record is None:
        ctx.record = new_record(node, ctx.policy, ctx.now, v)
    rec = ctx.rec
    inc = replace(rec.incident, opened_at=ctx.now, severity=v.severity, rules=v.rules,
                  gpus=v.gpus, summary=v.summary(), evidence=v.evidence)
    ctx.record = replace(rec, incident=inc, policy=ctx.policy.name, mode=ctx.policy.mode)
    ctx.event("opened", "IncidentOpened",
              f"{inc.severity.label}: {inc.summary} (policy {ctx.policy.name}, "
              f"mode {ctx.policy.mode.value})", warning=True)


OPEN_INCIDENT = Effect("open incident", _open_incident)


def _open_suspect(ctx: Ctx) -> None:
    v = ctx.trigger.verdict
    assert v is not None
    assert ctx.policy is not None
    ctx.record = new_record(ctx.trigger.node, ctx.policy, ctx.now, v)


OPEN_SUSPECT = Effect("note suspicion", _open_suspect)


def _upgrade_severity(ctx: Ctx) -> None:
    v = ctx.trigger.verdict
    assert v is not None
    inc = ctx.rec.incident
    ctx.record = replace(ctx.rec, incident=replace(
        inc, severity=Severity.FAILED, rules=tuple(dict.fromkeys(inc.rules + v.rules)),
        gpus=tuple(sorted(set(inc.gpus) | set(v.gpus))), summary=v.summary(),
        evidence=(inc.evidence + v.evidence)[-EVIDENCE_LIMIT:]))
    ctx.event("upgraded", "SeverityRaised", f"now failed: {v.summary()}", warning=True)


UPGRADE = Effect("raise severity to failed", _upgrade_severity)


def _block(guardrail: Guardrail, message: str) -> Callable[[Ctx], None]:
    def apply(ctx: Ctx) -> None:
        _set_block(ctx, GuardrailBlock(guardrail, message))
    return apply


def _set_block(ctx: Ctx, block: GuardrailBlock) -> None:
    prev = ctx.rec.blocked
    ctx.record = replace(ctx.rec, blocked=block)
    if prev is None or prev.guardrail != block.guardrail:
        ctx.event(f"blocked-{block.guardrail}", "GuardrailBlocked", block.message, warning=True)


BLOCK_OBSERVE = Effect("hold: observe-only",
                       _block(Guardrail.OBSERVE_ONLY, "policy mode is observe: no step is taken"))
BLOCK_UNCONFIRMED = Effect("hold: unconfirmed",
                           _block(Guardrail.UNCONFIRMED, "latest verdict is not degrading/failed"))


def _block_guardrail(ctx: Ctx) -> None:
    b = ctx.admission.block
    assert b is not None
    _set_block(ctx, b)


BLOCK_GUARDRAIL = Effect("hold: guardrail", _block_guardrail)


def admit(first: str) -> Effect:
    """Admit the remediation (clear the block, fix the mode) and issue its first step."""
    def apply(ctx: Ctx) -> None:
        assert ctx.policy is not None
        ctx.record = replace(ctx.rec, blocked=None, mode=ctx.policy.mode)
        ctx.issue(build_action(ctx, first))
        ctx.event("admitted", "RemediationStarted",
                  f"{ctx.rec.incident.summary}; first step {first} (mode {ctx.rec.mode.value})")
    return Effect(f"admit, issue {first}", apply)


def escalate(why: str | None = None) -> Effect:
    """Close the open steps and hand the node to a human, saying why (``why`` or the cause)."""
    def apply(ctx: Ctx) -> None:
        reason = why
        if reason is None:
            r = ctx.result
            if ctx.trigger.kind is TriggerKind.STEP and r is not None:
                reason = f"step {r.step} {r.status.value}: {r.error or 'no detail'}"
            elif ctx.admission_block_reason():
                reason = ctx.admission_block_reason()
            else:
                reason = f"deadline of phase {ctx.rec.phase.value} passed"
        ctx.close_open("superseded by escalation")
        ctx.record = replace(ctx.rec, outcome=RecordOutcome.ESCALATED, outcome_detail=reason)
        ctx.issue(build_action(ctx, StepName.ESCALATE))
        ctx.event("escalated", "Escalated", reason, warning=True)
    return Effect("escalate" + (f" ({why})" if why else ""), apply)


ESCALATE = escalate()


def _undo(reason: RecordOutcome, undo: bool) -> Effect:
    """Enter Recovered/Cancelled: give back only what this incident's steps took."""

    def apply(ctx: Ctx) -> None:
        rec = ctx.rec
        ctx.close_open(f"superseded: {reason.value}")
        ctx.record = replace(ctx.rec, outcome=reason, blocked=None)
        if undo:
            started = {s.step for s in rec.ledger}
            if rec.spare and StepName.MOVE_WORKLOAD not in started:
                ctx.issue(build_action(ctx, StepName.RELEASE_SPARE))
            if StepName.DRAIN in started:
                ctx.issue(build_action(ctx, StepName.UNDO_DRAIN))
            if StepName.DRAIN in started or StepName.CORDON in started:
                ctx.issue(build_action(ctx, StepName.UNCORDON))
        ctx.event(reason, reason.capitalize(), _undo_note(ctx, reason, undo))
    return Effect(f"{reason}: undo own changes" if undo else reason, apply)


def _undo_note(ctx: Ctx, reason: str, undo: bool) -> str:
    undone = [a.describe() for a in ctx.actions if not isinstance(a, EmitEvent)]
    if undone:
        return f"{reason}; undoing healer's own changes: {', '.join(undone)}"
    if not undo:
        taken = [s.step for s in ctx.rec.ledger if s.outcome is StepOutcome.DONE]
        if taken:
            return f"{reason}; healer's changes left in place for the operator: {', '.join(taken)}"
    return f"{reason}; nothing to undo"


RECOVER = _undo(RecordOutcome.RECOVERED, undo=True)
CANCEL_UNDO = _undo(RecordOutcome.CANCELLED, undo=True)
CANCEL_KEEP = _undo(RecordOutcome.CANCELLED, undo=False)


def _set_spare(ctx: Ctx) -> None:
    record_spare(ctx)
    ctx.issue(build_action(ctx, StepName.MOVE_WORKLOAD))


def record_spare(ctx: Ctx) -> None:
    """Record the claimed spare (and its placement) the trigger reports, with its Events."""
    r = ctx.result
    assert r is not None
    placed = placement_of(r.get)
    ctx.record = replace(ctx.rec, spare=r.get(StepKey.SPARE), spare_placement=placed)
    rec = ctx.rec
    where = f" ({placed.describe(rec.node, rec.spare)})" if placed is not None else ""
    ctx.event("spare", "SpareClaimed", f"spare {rec.spare} claimed to replace {rec.node}{where}")
    if placed is not None and not placed.same_domain:
        # the replacement serves outside the node's NVLink domain: jobs that need the
        # domain's fabric see a different topology (swap.requireSameDomain refuses this)
        ctx.event("spare-far", "SpareFromOtherDomain",
                  f"{placed.describe(rec.node, rec.spare)} (placement {placed.level})",
                  warning=True)


SWAP_IN = Effect("record spare, issue move-workload", _set_spare)


def _held(ctx: Ctx) -> None:
    r = ctx.result
    ctx.event("held", "HeldForCapacity",
              f"no warm spare fits {ctx.rec.node} ({(r.error if r else '') or 'pool empty'}); "
              "the node stays drained and cordoned until one does", warning=True)


def held_reason(rec: NodeRecord) -> str:
    """Why ``rec`` is held for capacity: what the latest claim said (for ``healer status``)."""
    s = rec.step(StepName.CLAIM_SPARE)
    why = (s.error if s is not None and s.error else "") or "no warm spare fits"
    return f"held for capacity: {why}"


HELD = Effect("hold for capacity", _held)


#: The mark-repair step's detail when the repair found no fault (core.outcomes reads it).
NO_FAULT_DETAIL = f"repair-result={REPAIR_NO_FAULT}"


def _mark_repaired(ctx: Ctx) -> None:
    ctx.record = replace(ctx.rec, repaired=True)
    s = ctx.rec.step(StepName.MARK_REPAIR)
    if ctx.trigger.repair_no_fault and s is not None and NO_FAULT_DETAIL not in s.detail:
        detail = ",".join(d for d in (s.detail, NO_FAULT_DETAIL) if d)
        ctx.record = ctx.rec.replace_latest(replace(s, detail=detail))


MARK_REPAIRED = Effect("mark repaired", _mark_repaired)


def _after_repair(ctx: Ctx) -> None:
    _mark_repaired(ctx)
    if ctx.rec.spare:
        step = (StepName.VALIDATE_REPAIRED if ctx.steps.validation.enabled
                else StepName.RETURN_TO_POOL)
        ctx.issue(build_action(ctx, step))


AFTER_REPAIR = Effect("mark repaired; validate or return to pool", _after_repair)


def _done(ctx: Ctx) -> None:
    if ctx.rec.outcome is None:
        ctx.record = replace(ctx.rec, outcome=RecordOutcome.REPLACED if ctx.rec.spare
                             else RecordOutcome.REPAIRED)
    ctx.event("done", "RemediationDone", f"{ctx.rec.node}: {ctx.rec.outcome_text}")


DONE = Effect("close", _done)


def _observe_slurm(ctx: Ctx) -> None:
    rec = ctx.rec
    ctx.actions.append(ObserveSlurm(rec.incident.id, rec.node, slurm_node=rec.slurm_node))


OBSERVE = Effect("observe slurm", _observe_slurm)


def _poll_and_observe(ctx: Ctx) -> None:
    _poll(ctx)
    if ctx.rec.step_ok(StepName.DRAIN):
        _observe_slurm(ctx)


POLL_DRAIN = Effect("poll; observe slurm once the drain is accepted", _poll_and_observe)


def _checkpoint_timeout(ctx: Ctx) -> None:
    rec = ctx.rec
    s = rec.step(StepName.CHECKPOINT)
    if s is not None and not s.done:
        ctx.record = rec.with_step(replace(s, finished_at=ctx.now, outcome=StepOutcome.TIMEOUT,
                                           error="no acknowledgement before the deadline"))
    ctx.event("checkpoint-timeout", "CheckpointTimeout",
              "jobs did not acknowledge the checkpoint request in time; draining anyway",
              warning=True)
    ctx.issue(build_action(ctx, StepName.DRAIN))


CHECKPOINT_TIMEOUT = Effect("give up on checkpoint, issue drain", _checkpoint_timeout)


def _checkpoint_failed(ctx: Ctx) -> None:
    s = ctx.rec.step(StepName.CHECKPOINT)
    why = (s.error if s is not None and s.error else "the checkpoint hook failed")
    ctx.event("checkpoint-failed", "CheckpointFailed",
              f"the checkpoint request failed ({why}); draining anyway", warning=True)
    ctx.issue(build_action(ctx, StepName.DRAIN))


CHECKPOINT_FAILED = Effect("checkpoint failed, issue drain", _checkpoint_failed)


def in_order(*effects: Effect) -> Effect:
    """Apply ``effects`` one after the other, as one effect."""
    def apply(ctx: Ctx) -> None:
        for e in effects:
            e(ctx)
    return Effect(", ".join(e.name for e in effects), apply)


# ---------------------------------------------------------------------------------------------
