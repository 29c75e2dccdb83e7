"""The remediation state machine, as a transition table.

``TRANSITIONS`` is data: rows of (source phase, trigger kind, guard, target phase, effect). The
first row of a (phase, trigger) pair whose guard holds is applied; every handled pair ends with
an unconditional row, and every pair that is not handled is listed in ``IGNORED`` with a reason
(a test checks that the two together cover every pair, and that every phase can reach Done,
Escalated or Cancelled). After each transition the machine applies ``AUTO`` rows until the phase
settles, so entering Degrading admits the remediation at once when the guardrails allow it.

:func:`step` is the only entry point: ``(record, trigger, now, view) -> Decision``. It never
performs I/O; the executor runs the Decision's actions and reports their outcomes as new
triggers. Intent is recorded in the ledger (a started, unfinished step) by the same call that
emits an action, so a runtime that persists the returned record *before* running the actions
can always resume: ``RESUME`` re-issues every open step (actions are idempotent).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from healer.core.actions import (
    Action,
    AnnotateTopology,
    AwaitReplacement,
    Checkpoint,
    ClaimSpare,
    Cordon,
    DrainSlurm,
    EmitEvent,
    Escalate,
    MarkRepair,
    MoveWorkload,
    ObserveSlurm,
    ReleaseSpare,
    RequeueJobs,
    ReturnToPool,
    StepStatus,
    Uncordon,
    UndrainSlurm,
    Validate,
)
from healer.core.budget import Admission, BudgetView, check_admission
from healer.core.health import Verdict
from healer.core.model import (
    EVIDENCE_LIMIT,
    HISTORY_LIMIT,
    EventRecord,
    GuardrailBlock,
    HealthState,
    Incident,
    NodeRecord,
    Outcome,
    Severity,
    StepRecord,
    TransitionRecord,
)
from healer.core.phases import ACTIVE, TERMINAL, Phase
from healer.core.rules import (
    CheckpointTimeout,
    DrainTimeout,
    LabelSelector,
    Mode,
    Policy,
    Steps,
)
from healer.core.topology import placement_of

#: Label that opts a node out of remediation.
EXCLUDE_LABEL = "healer.io/exclude"
#: Prefix of every Slurm drain reason healer sets.
REASON_PREFIX = "healer: "
#: How often a node held for capacity asks the spare pool again when no spare has appeared.
HELD_RETRY = 300.0


class TriggerKind(enum.Enum):
    VERDICT = "verdict"  # a new health verdict for the node
    STEP = "step"  # the outcome of a ledgered action
    SLURM = "slurm"  # an observation of the Slurm node's state
    TICK = "tick"  # time passed: deadlines, polls, admission retries
    RESUME = "resume"  # the runtime (re)started: re-issue every open step
    ADMIN_UNCORDON = "admin-uncordon"  # someone uncordoned a node healer cordoned
    OPT_OUT = "opt-out"  # the node was labelled healer.io/exclude=true
    CAPACITY = "capacity"  # the spare pool changed
    REPAIR = "repair"  # the repair hand-off reported a result
    AUTO = "auto"  # internal: applied after every transition until the phase settles


@dataclass(frozen=True, slots=True)
class StepResult:
    step: str  # the ledger step name (``Action.ledger_name``)
    status: StepStatus
    error: str = ""
    data: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str = "") -> str:
        for k, v in self.data:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class SlurmObservation:
    drain: bool  # DRAIN flag set (and not UNDRAIN)
    busy: bool  # ALLOCATED, MIXED or COMPLETING
    down: bool = False
    reason: str = ""
    ours: bool = False  # the reason starts with ``healer: ``


@dataclass(frozen=True, slots=True)
class Trigger:
    kind: TriggerKind
    node: str
    at: float
    incident: str = ""  # STEP/SLURM/REPAIR: the incident the result belongs to
    verdict: Verdict | None = None
    result: StepResult | None = None
    slurm: SlurmObservation | None = None
    repair_passed: bool | None = None

    def describe(self) -> str:
        if self.kind is TriggerKind.VERDICT and self.verdict is not None:
            return f"verdict {self.verdict.state.value}"
        if self.kind is TriggerKind.STEP and self.result is not None:
            return f"{self.result.step} {self.result.status.value}"
        if self.kind is TriggerKind.SLURM and self.slurm is not None:
            s = self.slurm
            return f"slurm drain={s.drain} busy={s.busy}"
        if self.kind is TriggerKind.REPAIR:
            return f"repair {'passed' if self.repair_passed else 'failed'}"
        return str(self.kind.value)


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`step` decided: the new record, what to do, and when to look again."""

    record: NodeRecord | None  # None: the node is healthy and has no incident
    actions: tuple[Action, ...] = ()
    recheck_after: float | None = None  # seconds
    transitions: tuple[tuple[Phase, Phase, str], ...] = ()
    note: str = ""

    @property
    def phase(self) -> Phase:
        return Phase(self.record.phase) if self.record is not None else Phase.HEALTHY


# ---------------------------------------------------------------------------------------------
# Context, guards and effects


class Ctx:
    """Everything a guard or an effect may look at. Effects update ``record``."""

    def __init__(self, record: NodeRecord | None, trigger: Trigger, now: float,
                 view: BudgetView, policy: Policy | None) -> None:
        self.record = record
        self.trigger = trigger
        self.now = now
        self.view = view
        self.policy = policy
        self.actions: list[Action] = []
        self.backoff: float | None = None  # set when a step failed transiently
        self._admission: Admission | None = None

    @property
    def rec(self) -> NodeRecord:
        assert self.record is not None
        return self.record

    @property
    def steps(self) -> Steps:
        return self.policy.steps if self.policy is not None else Steps()

    @property
    def admission(self) -> Admission:
        if self._admission is None:
            assert self.policy is not None
            serials = tuple(g.serial for g in self.rec.incident.gpus if g.serial)
            self._admission = check_admission(self.rec.node, serials, self.policy, self.view,
                                              self.now, self.rec.incident.id,
                                              self.rec.incident.opened_at)
        return self._admission

    # -- ledger helpers ----------------------------------------------------------------------

    def issue(self, action: Action, retry: bool = False, reopen: bool = False) -> None:
        """Emit ``action``; a ledgered one records its intent in the ledger first.

        An open step is polled (same attempt) or retried (``retry``: one more attempt). A
        finished step is started afresh, unless ``reopen`` asks to try the same step again (a
        node held for capacity asking for a spare), which keeps one ledger entry.
        """
        if action.ledgered:
            rec = self.rec
            prev = rec.step(action.ledger_name)
            if prev is not None and not prev.done:
                self.record = rec.with_step(replace(prev, attempts=prev.attempts + int(retry)))
            elif prev is not None and reopen:
                self.record = rec.replace_latest(StepRecord(
                    action.ledger_name, self.now, attempts=prev.attempts + 1))
            else:
                self.record = rec.with_step(StepRecord(action.ledger_name, self.now))
        self.actions.append(action)

    def close_open(self, why: str) -> None:
        """Mark every open step as skipped: the flow moved on without it."""
        for s in self.open_steps():
            self.record = self.rec.with_step(replace(
                s, finished_at=self.now, outcome=Outcome.SKIPPED, error=why))

    def admission_block_reason(self) -> str:
        adm = self._admission
        return adm.block.message if adm is not None and adm.block is not None else ""

    def event(self, name: str, reason: str, note: str, warning: bool = False) -> None:
        self.actions.append(EmitEvent(self.rec.incident.id, self.rec.node, reason=reason,
                                      note=note, type="Warning" if warning else "Normal",
                                      name=name))

    def open_steps(self) -> list[StepRecord]:
        return [s for s in self.rec.ledger if not s.done]


@dataclass(frozen=True, slots=True)
class Guard:
    name: str
    test: Callable[[Ctx], bool]

    def __call__(self, ctx: Ctx) -> bool:
        return self.test(ctx)


@dataclass(frozen=True, slots=True)
class Effect:
    name: str
    apply: Callable[[Ctx], None]

    def __call__(self, ctx: Ctx) -> None:
        self.apply(ctx)


def _result(ctx: Ctx) -> StepResult | None:
    return ctx.trigger.result


def result_is(step: str, *statuses: StepStatus) -> Guard:
    def test(ctx: Ctx) -> bool:
        r = _result(ctx)
        return r is not None and r.step == step and r.status in statuses
    names = "|".join(s.value for s in statuses)
    return Guard(f"{step} {names}", test)


def _attempts_left(ctx: Ctx) -> bool:
    r = _result(ctx)
    if r is None:
        return False
    s = ctx.rec.step(r.step)
    return s is not None and not s.done and s.attempts < ctx.steps.max_attempts


def _verdict(ctx: Ctx) -> HealthState | None:
    v = ctx.trigger.verdict
    return v.state if v is not None else None


def _record_verdict(ctx: Ctx) -> HealthState:
    return HealthState(ctx.rec.verdict)


def _node_excluded(ctx: Ctx) -> bool:
    """Opted out (``healer.io/exclude=true``), or a warm spare (not serving: not remediated)."""
    n = ctx.view.nodes.get(ctx.trigger.node)
    if n is None:
        return False
    if n.labels.get(EXCLUDE_LABEL, "").lower() == "true":
        return True
    spares = ctx.view.policies.fleet.spare_selector
    return bool(spares.match_labels or spares.match_expressions) and spares.matches(n.labels)


def phase_deadline(rec: NodeRecord, policy: Policy | None) -> float | None:
    """The absolute deadline of ``rec``'s current phase, if it has one."""
    st = policy.steps if policy is not None else Steps()
    phase = Phase(rec.phase)

    def since(step: str) -> float | None:
        s = rec.step(step)
        return s.started_at if s is not None else None

    if phase is Phase.CHECKPOINTING:
        t = since("checkpoint")
        return None if t is None else t + st.checkpoint.deadline
    if phase is Phase.DRAINING:
        t = since("drain")
        if t is None:
            return None
        end = t + st.drain.deadline
        rq = rec.step("requeue")
        if rq is not None:
            end = rq.started_at + st.drain.requeue_grace
        return end
    if phase is Phase.SWAPPING:
        return rec.phase_since + st.swap.deadline
    if phase is Phase.VALIDATING:
        return rec.phase_since + st.validation.deadline
    if phase is Phase.HELD_FOR_CAPACITY:
        return rec.phase_since + st.swap.hold_timeout if st.swap.hold_timeout > 0 else None
    if phase is Phase.REPAIR:
        return rec.phase_since + st.repair.deadline if st.repair.deadline > 0 else None
    opens = [s.started_at for s in rec.ledger if not s.done]
    if phase in TERMINAL or not opens:
        return None
    return min(opens) + st.step_deadline


def _deadline(ctx: Ctx) -> float | None:
    return phase_deadline(ctx.rec, ctx.policy)


def _deadline_passed(ctx: Ctx) -> bool:
    d = _deadline(ctx)
    return d is not None and ctx.now >= d


ALWAYS = Guard("always", lambda ctx: True)
VERDICT_HEALTHY = Guard("verdict healthy", lambda ctx: _verdict(ctx) is HealthState.HEALTHY)
VERDICT_CONFIRMED = Guard("verdict degrading|failed",
                          lambda ctx: (v := _verdict(ctx)) is not None and v.is_confirmed)
VERDICT_FAILED = Guard("verdict failed", lambda ctx: _verdict(ctx) is HealthState.FAILED)
GOVERNED = Guard("node governed", lambda ctx: ctx.policy is not None and not _node_excluded(ctx))
UNGOVERNED = Guard("policy gone, node opted out or a spare",
                   lambda ctx: ctx.policy is None or _node_excluded(ctx))
PAUSED = Guard("paused", lambda ctx: ctx.view.is_paused(ctx.trigger.node))
OBSERVE_ONLY = Guard("observe-only",
                     lambda ctx: ctx.policy is not None and ctx.policy.mode is Mode.OBSERVE)
UNCONFIRMED = Guard("verdict not confirmed", lambda ctx: not _record_verdict(ctx).is_confirmed)
BUDGET_EXHAUSTED = Guard("retry budget exhausted", lambda ctx: ctx.admission.escalate)
BLOCKED = Guard("guardrail blocks", lambda ctx: not ctx.admission.allowed)
CHECKPOINT_FIRST = Guard(
    "checkpoint applies",
    lambda ctx: ctx.steps.checkpoint.applies_to(ctx.rec.incident.severity))
DEADLINE_PASSED = Guard("deadline passed", _deadline_passed)
HAS_OPEN_STEPS = Guard("open steps", lambda ctx: bool(ctx.open_steps()))
SLURM_DRAINED = Guard("slurm drained, not busy",
                      lambda ctx: ctx.trigger.slurm is not None and ctx.trigger.slurm.drain
                      and not ctx.trigger.slurm.busy)
DRAIN_ESCALATES = Guard(
    "drain deadline passed, policy escalates",
    lambda ctx: _deadline_passed(ctx) and (ctx.steps.drain.on_timeout is DrainTimeout.ESCALATE
                                           or ctx.rec.step("requeue") is not None))
DRAIN_REQUEUES = Guard(
    "drain deadline passed, policy requeues",
    lambda ctx: _deadline_passed(ctx) and ctx.steps.drain.on_timeout is DrainTimeout.REQUEUE
    and ctx.rec.step("requeue") is None)
DRAIN_ACCEPTED = Guard("drain accepted", lambda ctx: ctx.rec.step_ok("drain"))
CHECKPOINT_CONTINUES = Guard(
    "policy continues on checkpoint timeout",
    lambda ctx: ctx.steps.checkpoint.on_timeout is CheckpointTimeout.CONTINUE)
SWAP_ENABLED = Guard("swap enabled", lambda ctx: ctx.steps.swap.enabled)
VALIDATION_ENABLED = Guard("validation enabled", lambda ctx: ctx.steps.validation.enabled)
SWAPPED = Guard("replaced by a spare", lambda ctx: bool(ctx.rec.spare))
REPAIR_PASSED = Guard("repair passed", lambda ctx: ctx.trigger.repair_passed is True)
SERIAL_BUDGET_EXHAUSTED = Guard(
    "GPU serial over its retry budget",
    lambda ctx: ctx.admission.block is not None
    and ctx.admission.block.guardrail == "retry-budget-gpu")
UNDO_FINISHED = Guard("undo finished", lambda ctx: not ctx.open_steps())


# -- effects ------------------------------------------------------------------------------------


def _reason(rec: NodeRecord) -> str:
    """The drain reason: what is wrong, then ``[incident-id]`` (always kept whole: undrain and
    the Slinky driver find healer's incident in it)."""
    tail = f" [{rec.incident.id}]"
    summary = rec.incident.summary or ",".join(rec.incident.rules)
    room = max(250 - len(REASON_PREFIX) - len(tail), 0)
    if len(summary) > room:
        summary = summary[:max(room - 1, 0)] + "…"
    return f"{REASON_PREFIX}{summary}{tail}"


def build_action(ctx: Ctx, ledger_name: str) -> Action:
    """The action that (re)runs ``ledger_name`` for the current record."""
    rec = ctx.rec
    inc, node, st = rec.incident.id, rec.node, ctx.steps
    match ledger_name:
        case "checkpoint":
            cp = st.checkpoint
            return Checkpoint(inc, node, hook=cp.hook, signal=cp.signal,
                              slurm_node=rec.slurm_node, url=cp.url, secret_ref=cp.secret_ref,
                              job_template=cp.job_template)
        case "drain":
            return DrainSlurm(inc, node, slurm_node=rec.slurm_node, reason=_reason(rec))
        case "requeue":
            return RequeueJobs(inc, node, slurm_node=rec.slurm_node)
        case "cordon":
            return Cordon(inc, node, reason=_reason(rec))
        case "claim-spare":
            return ClaimSpare(inc, node, same_domain=st.swap.require_same_domain)
        case "move-workload":
            return MoveWorkload(inc, node, spare=rec.spare, slurm_node=rec.slurm_node)
        case "await-replacement":
            return AwaitReplacement(inc, node, spare=rec.spare, slurm_node=rec.slurm_node)
        case "annotate-topology":
            return AnnotateTopology(inc, node, target=rec.spare or node, slurm_node=rec.slurm_node)
        case "validate-replacement":
            return Validate(inc, node, target=rec.spare or node, image=st.validation.image,
                            command=st.validation.command, purpose="replacement")
        case "validate-repaired":
            return Validate(inc, node, target=node, image=st.validation.image,
                            command=st.validation.command, purpose="repaired")
        case "undrain":
            return UndrainSlurm(inc, node, target=rec.spare or node, slurm_node=rec.slurm_node)
        case "undo-drain":
            return UndrainSlurm(inc, node, target=node, slurm_node=rec.slurm_node, purpose="undo")
        case "uncordon":
            return Uncordon(inc, node)
        case "release-spare":
            return ReleaseSpare(inc, node, spare=rec.spare)
        case "mark-repair":
            return MarkRepair(inc, node, hook=st.repair.hook, url=st.repair.url,
                              secret_ref=st.repair.secret_ref,
                              job_template=st.repair.job_template)
        case "return-to-pool":
            return ReturnToPool(inc, node)
        case "escalate":
            return Escalate(inc, node, reason=rec.outcome or "escalated")
    raise KeyError(ledger_name)


def _issue(*steps: str, reopen: bool = False) -> Effect:
    def apply(ctx: Ctx) -> None:
        for s in steps:
            ctx.issue(build_action(ctx, s), reopen=reopen)
    return Effect(("retry " if reopen else "issue ") + ", ".join(steps), apply)


def _noop(ctx: Ctx) -> None:
    return None


NOTHING = Effect("nothing", _noop)


def _poll(ctx: Ctx) -> None:
    """Re-issue every open step (same attempt: a poll, not a retry)."""
    for s in ctx.open_steps():
        ctx.issue(build_action(ctx, s.step))


POLL = Effect("poll open steps", _poll)


#: Longest wait before a failed step is tried again.
MAX_BACKOFF = 300.0


def _retry(ctx: Ctx) -> None:
    """Count the failed attempt; the step stays open and is re-issued by the TICK that the
    backoff schedules (poll interval doubling per attempt, capped)."""
    r = _result(ctx)
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
        ctx.record = _new_record(node, ctx.policy, ctx.now, v)
    rec = ctx.rec
    inc = replace(rec.incident, opened_at=ctx.now, severity=v.severity, rules=v.rules,
                  gpus=v.gpus, summary=v.summary(), evidence=v.evidence)
    ctx.record = replace(rec, incident=inc, policy=ctx.policy.name, mode=ctx.policy.mode.value)
    ctx.event("opened", "IncidentOpened",
              f"{inc.severity.label}: {inc.summary} (policy {ctx.policy.name}, "
              f"mode {ctx.policy.mode.value})", warning=True)


OPEN_INCIDENT = Effect("open incident", _open_incident)


def _open_suspect(ctx: Ctx) -> None:
    v = ctx.trigger.verdict
    assert v is not None
    assert ctx.policy is not None
    ctx.record = _new_record(ctx.trigger.node, ctx.policy, ctx.now, v)


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


def _block(guardrail: str, message: str) -> Callable[[Ctx], None]:
    def apply(ctx: Ctx) -> None:
        _set_block(ctx, GuardrailBlock(guardrail, message))
    return apply


def _set_block(ctx: Ctx, block: GuardrailBlock) -> None:
    prev = ctx.rec.blocked
    ctx.record = replace(ctx.rec, blocked=block)
    if prev is None or prev.guardrail != block.guardrail:
        ctx.event(f"blocked-{block.guardrail}", "GuardrailBlocked", block.message, warning=True)


BLOCK_OBSERVE = Effect("hold: observe-only",
                       _block("observe-only", "policy mode is observe: no step is taken"))
BLOCK_UNCONFIRMED = Effect("hold: unconfirmed",
                           _block("unconfirmed", "latest verdict is not degrading/failed"))


def _block_guardrail(ctx: Ctx) -> None:
    b = ctx.admission.block
    assert b is not None
    _set_block(ctx, b)


BLOCK_GUARDRAIL = Effect("hold: guardrail", _block_guardrail)


def _admit(first: str) -> Effect:
    def apply(ctx: Ctx) -> None:
        assert ctx.policy is not None
        ctx.record = replace(ctx.rec, blocked=None, mode=ctx.policy.mode.value)
        ctx.issue(build_action(ctx, first))
        ctx.event("admitted", "RemediationStarted",
                  f"{ctx.rec.incident.summary}; first step {first} (mode {ctx.rec.mode})")
    return Effect(f"admit, issue {first}", apply)


def _escalate(why: str | None = None) -> Effect:
    def apply(ctx: Ctx) -> None:
        reason = why
        if reason is None:
            r = _result(ctx)
            if ctx.trigger.kind is TriggerKind.STEP and r is not None:
                reason = f"step {r.step} {r.status.value}: {r.error or 'no detail'}"
            elif ctx.admission_block_reason():
                reason = ctx.admission_block_reason()
            else:
                reason = f"deadline of phase {ctx.rec.phase} passed"
        ctx.close_open("superseded by escalation")
        ctx.record = replace(ctx.rec, outcome=reason)
        ctx.issue(build_action(ctx, "escalate"))
        ctx.event("escalated", "Escalated", reason, warning=True)
    return Effect("escalate" + (f" ({why})" if why else ""), apply)


ESCALATE = _escalate()


def _undo(reason: str, undo: bool) -> Effect:
    """Enter Recovered/Cancelled: give back only what this incident's steps took."""

    def apply(ctx: Ctx) -> None:
        rec = ctx.rec
        ctx.close_open(f"superseded: {reason}")
        ctx.record = replace(ctx.rec, outcome=reason, blocked=None)
        if undo:
            started = {s.step for s in rec.ledger}
            if rec.spare and "move-workload" not in started:
                ctx.issue(build_action(ctx, "release-spare"))
            if "drain" in started:
                ctx.issue(build_action(ctx, "undo-drain"))
            if "drain" in started or "cordon" in started:
                ctx.issue(build_action(ctx, "uncordon"))
        ctx.event(reason, reason.capitalize(), _undo_note(ctx, reason, undo))
    return Effect(f"{reason}: undo own changes" if undo else reason, apply)


def _undo_note(ctx: Ctx, reason: str, undo: bool) -> str:
    undone = [a.describe() for a in ctx.actions if not isinstance(a, EmitEvent)]
    if undone:
        return f"{reason}; undoing healer's own changes: {', '.join(undone)}"
    if not undo:
        taken = [s.step for s in ctx.rec.ledger if s.outcome is Outcome.OK]
        if taken:
            return f"{reason}; healer's changes left in place for the operator: {', '.join(taken)}"
    return f"{reason}; nothing to undo"


RECOVER = _undo("recovered", undo=True)
CANCEL_UNDO = _undo("cancelled", undo=True)
CANCEL_KEEP = _undo("cancelled", undo=False)


def _set_spare(ctx: Ctx) -> None:
    r = _result(ctx)
    assert r is not None
    placed = placement_of(r.get)
    ctx.record = replace(ctx.rec, spare=r.get("spare"), spare_placement=placed)
    ctx.issue(build_action(ctx, "move-workload"))
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
    r = _result(ctx)
    ctx.event("held", "HeldForCapacity",
              f"no warm spare fits {ctx.rec.node} ({(r.error if r else '') or 'pool empty'}); "
              "the node stays drained and cordoned until one does", warning=True)


def held_reason(rec: NodeRecord) -> str:
    """Why ``rec`` is held for capacity: what the latest claim said (for ``healer status``)."""
    s = rec.step("claim-spare")
    why = (s.error if s is not None and s.error else "") or "no warm spare fits"
    return f"held for capacity: {why}"


HELD = Effect("hold for capacity", _held)


def _mark_repaired(ctx: Ctx) -> None:
    ctx.record = replace(ctx.rec, repaired=True)


MARK_REPAIRED = Effect("mark repaired", _mark_repaired)


def _after_repair(ctx: Ctx) -> None:
    _mark_repaired(ctx)
    if ctx.rec.spare:
        step = "validate-repaired" if ctx.steps.validation.enabled else "return-to-pool"
        ctx.issue(build_action(ctx, step))


AFTER_REPAIR = Effect("mark repaired; validate or return to pool", _after_repair)


def _done(ctx: Ctx) -> None:
    if not ctx.rec.outcome:
        ctx.record = replace(ctx.rec, outcome="replaced" if ctx.rec.spare else "repaired")
    ctx.event("done", "RemediationDone", f"{ctx.rec.node}: {ctx.rec.outcome}")


DONE = Effect("close", _done)


def _observe_slurm(ctx: Ctx) -> None:
    rec = ctx.rec
    ctx.actions.append(ObserveSlurm(rec.incident.id, rec.node, slurm_node=rec.slurm_node))


OBSERVE = Effect("observe slurm", _observe_slurm)


def _poll_and_observe(ctx: Ctx) -> None:
    _poll(ctx)
    if ctx.rec.step_ok("drain"):
        _observe_slurm(ctx)


POLL_DRAIN = Effect("poll; observe slurm once the drain is accepted", _poll_and_observe)


def _checkpoint_timeout(ctx: Ctx) -> None:
    rec = ctx.rec
    s = rec.step("checkpoint")
    if s is not None and not s.done:
        ctx.record = rec.with_step(replace(s, finished_at=ctx.now, outcome=Outcome.TIMEOUT,
                                           error="no acknowledgement before the deadline"))
    ctx.event("checkpoint-timeout", "CheckpointTimeout",
              "jobs did not acknowledge the checkpoint request in time; draining anyway",
              warning=True)
    ctx.issue(build_action(ctx, "drain"))


CHECKPOINT_TIMEOUT = Effect("give up on checkpoint, issue drain", _checkpoint_timeout)


def _checkpoint_failed(ctx: Ctx) -> None:
    s = ctx.rec.step("checkpoint")
    why = (s.error if s is not None and s.error else "the checkpoint hook failed")
    ctx.event("checkpoint-failed", "CheckpointFailed",
              f"the checkpoint request failed ({why}); draining anyway", warning=True)
    ctx.issue(build_action(ctx, "drain"))


CHECKPOINT_FAILED = Effect("checkpoint failed, issue drain", _checkpoint_failed)


def _seq(*effects: Effect) -> Effect:
    def apply(ctx: Ctx) -> None:
        for e in effects:
            e(ctx)
    return Effect(", ".join(e.name for e in effects), apply)


# ---------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True, slots=True)
class Transition:
    source: Phase
    trigger: TriggerKind
    guard: Guard
    target: Phase | None  # None: stay
    effect: Effect = NOTHING

    @property
    def label(self) -> str:
        g = "" if self.guard is ALWAYS else f"[{self.guard.name}]"
        return f"{self.trigger.value}{g}"


P, K = Phase, TriggerKind
_T = Transition


def _step_failures(phase: Phase) -> list[Transition]:
    """Generic STEP handling shared by every working phase (after its specific rows)."""
    return [
        _T(phase, K.STEP, Guard("pending", lambda c: (r := _result(c)) is not None
                                and r.status is StepStatus.PENDING), None),
        _T(phase, K.STEP, Guard("retry, attempts left", lambda c: (r := _result(c)) is not None
                                and r.status is StepStatus.RETRY and _attempts_left(c)), None,
           RETRY),
        _T(phase, K.STEP, Guard("retries exhausted or failed", lambda c: (r := _result(c))
                                is not None and r.status in (StepStatus.RETRY, StepStatus.FAILED,
                                                             StepStatus.UNAVAILABLE)),
           P.ESCALATED, ESCALATE),
        _T(phase, K.STEP, ALWAYS, None),
    ]


def _working(phase: Phase, specific: list[Transition], *, tick: list[Transition] | None = None,
             verdict: list[Transition] | None = None,
             uncordon: Effect | None = None) -> list[Transition]:
    """A working phase: its own rows, then the shared handling of every other trigger."""
    rows = list(specific)
    rows += verdict if verdict is not None else [_T(phase, K.VERDICT, ALWAYS, None)]
    rows += _step_failures(phase)
    rows += tick if tick is not None else [_T(phase, K.TICK, DEADLINE_PASSED, P.ESCALATED,
                                              ESCALATE)]
    rows.append(_T(phase, K.TICK, ALWAYS, None, POLL))
    rows.append(_T(phase, K.RESUME, ALWAYS, None, POLL))
    if uncordon is not None:
        rows.append(_T(phase, K.ADMIN_UNCORDON, ALWAYS, P.CANCELLED, uncordon))
    rows.append(_T(phase, K.OPT_OUT, ALWAYS, P.CANCELLED, CANCEL_KEEP))
    return rows


def _confirmed(state: HealthState) -> Guard:
    return Guard(f"verdict {state.value}, node governed, not paused",
                 lambda c: _verdict(c) is state and GOVERNED(c) and not PAUSED(c))


def _pending_admission(phase: Phase) -> list[Transition]:
    upgrade = ([_T(phase, K.VERDICT, VERDICT_FAILED, P.FAILED, UPGRADE)]
               if phase is P.DEGRADING else [])
    return [
        *upgrade,
        _T(phase, K.VERDICT, VERDICT_HEALTHY, P.RECOVERED, RECOVER),
        _T(phase, K.VERDICT, ALWAYS, None),
        _T(phase, K.TICK, ALWAYS, None),
        _T(phase, K.RESUME, ALWAYS, None),
        _T(phase, K.OPT_OUT, ALWAYS, P.CANCELLED, CANCEL_KEEP),
        _T(phase, K.AUTO, UNGOVERNED, P.CANCELLED, CANCEL_KEEP),
        _T(phase, K.AUTO, OBSERVE_ONLY, None, BLOCK_OBSERVE),
        _T(phase, K.AUTO, UNCONFIRMED, None, BLOCK_UNCONFIRMED),
        _T(phase, K.AUTO, BUDGET_EXHAUSTED, P.ESCALATED, ESCALATE),
        _T(phase, K.AUTO, BLOCKED, None, BLOCK_GUARDRAIL),
        _T(phase, K.AUTO, CHECKPOINT_FIRST, P.CHECKPOINTING, _admit("checkpoint")),
        _T(phase, K.AUTO, ALWAYS, P.DRAINING, _admit("drain")),
    ]


def _build_table() -> tuple[Transition, ...]:
    rows: list[Transition] = [
        # -- Healthy: no record ------------------------------------------------------------
        _T(P.HEALTHY, K.VERDICT, _confirmed(HealthState.FAILED), P.FAILED, OPEN_INCIDENT),
        _T(P.HEALTHY, K.VERDICT, _confirmed(HealthState.DEGRADING), P.DEGRADING, OPEN_INCIDENT),
        _T(P.HEALTHY, K.VERDICT, _confirmed(HealthState.SUSPECT), P.SUSPECT, OPEN_SUSPECT),
        _T(P.HEALTHY, K.VERDICT, ALWAYS, None),
        # -- Suspect: waiting out for:/count -------------------------------------------------
        _T(P.SUSPECT, K.VERDICT, VERDICT_FAILED, P.FAILED, OPEN_INCIDENT),
        _T(P.SUSPECT, K.VERDICT, VERDICT_CONFIRMED, P.DEGRADING, OPEN_INCIDENT),
        _T(P.SUSPECT, K.VERDICT, VERDICT_HEALTHY, P.HEALTHY),
        _T(P.SUSPECT, K.VERDICT, ALWAYS, None),
        _T(P.SUSPECT, K.TICK, ALWAYS, None),
        _T(P.SUSPECT, K.RESUME, ALWAYS, None),
        _T(P.SUSPECT, K.OPT_OUT, ALWAYS, P.HEALTHY),
        _T(P.SUSPECT, K.AUTO, UNGOVERNED, P.HEALTHY),
        # -- Degrading / Failed: waiting for admission ---------------------------------------
        *_pending_admission(P.DEGRADING),
        *_pending_admission(P.FAILED),
        # -- Checkpointing -------------------------------------------------------------------
        *_working(P.CHECKPOINTING, [
            _T(P.CHECKPOINTING, K.STEP, result_is("checkpoint", StepStatus.DONE), P.DRAINING,
               _issue("drain")),
            _T(P.CHECKPOINTING, K.STEP, Guard("checkpoint failed, policy continues", lambda c: (
                (r := _result(c)) is not None and r.step == "checkpoint"
                and r.status in (StepStatus.FAILED, StepStatus.UNAVAILABLE)
                and CHECKPOINT_CONTINUES(c))), P.DRAINING, CHECKPOINT_FAILED),
        ], tick=[
            _T(P.CHECKPOINTING, K.TICK, Guard("deadline passed, policy continues", lambda c:
                                              DEADLINE_PASSED(c) and CHECKPOINT_CONTINUES(c)),
               P.DRAINING, CHECKPOINT_TIMEOUT),
            _T(P.CHECKPOINTING, K.TICK, DEADLINE_PASSED, P.ESCALATED,
               _escalate("checkpoint not acknowledged before the deadline")),
        ], verdict=[
            _T(P.CHECKPOINTING, K.VERDICT, VERDICT_HEALTHY, P.RECOVERED, RECOVER),
            _T(P.CHECKPOINTING, K.VERDICT, ALWAYS, None),
        ]),
        # -- Draining ------------------------------------------------------------------------
        *_working(P.DRAINING, [
            _T(P.DRAINING, K.STEP, result_is("drain", StepStatus.DONE), None, OBSERVE),
            _T(P.DRAINING, K.STEP, result_is("requeue", StepStatus.DONE), None, OBSERVE),
            _T(P.DRAINING, K.SLURM, SLURM_DRAINED, P.CORDONED, _issue("cordon")),
            _T(P.DRAINING, K.SLURM, DRAIN_REQUEUES, None, _issue("requeue")),
            _T(P.DRAINING, K.SLURM, DRAIN_ESCALATES, P.ESCALATED,
               _escalate("jobs still running on the node at the drain deadline")),
            _T(P.DRAINING, K.SLURM, ALWAYS, None),
        ], tick=[
            _T(P.DRAINING, K.TICK, Guard("drain not accepted by the deadline", lambda c:
                                         DEADLINE_PASSED(c) and not DRAIN_ACCEPTED(c)),
               P.ESCALATED, _escalate("the drain request was not accepted before the deadline")),
            _T(P.DRAINING, K.TICK, DRAIN_ACCEPTED, None, POLL_DRAIN),
        ], verdict=[
            _T(P.DRAINING, K.VERDICT, VERDICT_HEALTHY, P.RECOVERED, RECOVER),
            _T(P.DRAINING, K.VERDICT, ALWAYS, None),
        ], uncordon=CANCEL_UNDO),
        # -- Cordoned ------------------------------------------------------------------------
        *_working(P.CORDONED, [
            _T(P.CORDONED, K.STEP, Guard("cordon done, swap enabled", lambda c: result_is(
                "cordon", StepStatus.DONE)(c) and SWAP_ENABLED(c)), None, _issue("claim-spare")),
            _T(P.CORDONED, K.STEP, result_is("cordon", StepStatus.DONE), P.REPAIR,
               _issue("mark-repair")),
            _T(P.CORDONED, K.STEP, result_is("claim-spare", StepStatus.DONE), P.SWAPPING, SWAP_IN),
            _T(P.CORDONED, K.STEP, result_is("claim-spare", StepStatus.UNAVAILABLE),
               P.HELD_FOR_CAPACITY, HELD),
        ], uncordon=CANCEL_UNDO),
        # -- HeldForCapacity -----------------------------------------------------------------
        *_working(P.HELD_FOR_CAPACITY, [
            _T(P.HELD_FOR_CAPACITY, K.STEP, result_is("claim-spare", StepStatus.DONE),
               P.SWAPPING, SWAP_IN),
            _T(P.HELD_FOR_CAPACITY, K.STEP, result_is("claim-spare", StepStatus.UNAVAILABLE),
               None),
            _T(P.HELD_FOR_CAPACITY, K.CAPACITY, ALWAYS, None, _issue("claim-spare", reopen=True)),
        ], tick=[
            _T(P.HELD_FOR_CAPACITY, K.TICK, DEADLINE_PASSED, P.ESCALATED,
               _escalate("no spare became available before the hold timeout")),
            _T(P.HELD_FOR_CAPACITY, K.TICK, Guard("claim not in flight", lambda c: not
                                                  HAS_OPEN_STEPS(c)), None,
               _issue("claim-spare", reopen=True)),
        ], uncordon=CANCEL_UNDO),
        # -- Swapping ------------------------------------------------------------------------
        *_working(P.SWAPPING, [
            _T(P.SWAPPING, K.STEP, result_is("move-workload", StepStatus.DONE), None,
               _issue("await-replacement")),
            _T(P.SWAPPING, K.STEP, result_is("await-replacement", StepStatus.DONE), P.ANNOTATING,
               _issue("annotate-topology")),
        ]),
        # -- Annotating ----------------------------------------------------------------------
        *_working(P.ANNOTATING, [
            _T(P.ANNOTATING, K.STEP, Guard("annotated, validation enabled", lambda c: result_is(
                "annotate-topology", StepStatus.DONE)(c) and VALIDATION_ENABLED(c)),
               P.VALIDATING, _issue("validate-replacement")),
            _T(P.ANNOTATING, K.STEP, result_is("annotate-topology", StepStatus.DONE),
               P.UNDRAINING, _issue("undrain")),
        ]),
        # -- Validating ----------------------------------------------------------------------
        *_working(P.VALIDATING, [
            _T(P.VALIDATING, K.STEP, result_is("validate-replacement", StepStatus.DONE),
               P.UNDRAINING, _issue("undrain")),
            _T(P.VALIDATING, K.STEP, result_is("validate-replacement", StepStatus.FAILED),
               P.ESCALATED, _escalate("validation failed")),
        ]),
        # -- Undraining ----------------------------------------------------------------------
        *_working(P.UNDRAINING, [
            _T(P.UNDRAINING, K.STEP, Guard("undrained, old node to repair", lambda c: result_is(
                "undrain", StepStatus.DONE)(c) and SWAPPED(c)),
               P.REPAIR, _issue("mark-repair")),
            _T(P.UNDRAINING, K.STEP, result_is("undrain", StepStatus.DONE), None,
               _issue("uncordon")),
            _T(P.UNDRAINING, K.STEP, result_is("uncordon", StepStatus.DONE), P.DONE, DONE),
        ]),
        # -- Repair --------------------------------------------------------------------------
        *_working(P.REPAIR, [
            _T(P.REPAIR, K.REPAIR, Guard("passed, GPU serial over budget", lambda c:
                                         REPAIR_PASSED(c) and SERIAL_BUDGET_EXHAUSTED(c)),
               P.ESCALATED, _escalate("repaired GPU failed too often: not returned to service")),
            _T(P.REPAIR, K.REPAIR, Guard("passed, replaced by a spare", lambda c:
                                         REPAIR_PASSED(c) and SWAPPED(c)), None, AFTER_REPAIR),
            _T(P.REPAIR, K.REPAIR, Guard("passed, validation enabled", lambda c:
                                         REPAIR_PASSED(c) and VALIDATION_ENABLED(c)),
               P.VALIDATING, _seq(MARK_REPAIRED, _issue("validate-replacement"))),
            _T(P.REPAIR, K.REPAIR, REPAIR_PASSED, P.UNDRAINING,
               _seq(MARK_REPAIRED, _issue("undrain"))),
            _T(P.REPAIR, K.REPAIR, ALWAYS, P.ESCALATED, _escalate("repair failed")),
            _T(P.REPAIR, K.STEP, result_is("validate-repaired", StepStatus.DONE), None,
               _issue("return-to-pool")),
            _T(P.REPAIR, K.STEP, result_is("validate-repaired", StepStatus.FAILED), P.ESCALATED,
               _escalate("validation of the repaired node failed")),
            _T(P.REPAIR, K.STEP, result_is("return-to-pool", StepStatus.DONE), P.DONE, DONE),
        ], tick=[
            _T(P.REPAIR, K.TICK, DEADLINE_PASSED, P.ESCALATED,
               _escalate("repair did not finish before its deadline")),
        ], uncordon=CANCEL_KEEP),
        # -- Recovered: undo own changes, then Done ------------------------------------------
        _T(P.RECOVERED, K.AUTO, UNDO_FINISHED, P.DONE, NOTHING),
        *_working(P.RECOVERED, []),
        # -- terminal phases: only finish open undo steps ------------------------------------
        *[row for phase in (P.DONE, P.ESCALATED, P.CANCELLED) for row in (
            _T(phase, K.STEP, ALWAYS, None),
            _T(phase, K.RESUME, ALWAYS, None, POLL),
            _T(phase, K.TICK, HAS_OPEN_STEPS, None, POLL),
            _T(phase, K.TICK, ALWAYS, None),
        )],
    ]
    return tuple(rows)


TRANSITIONS: tuple[Transition, ...] = _build_table()

_WHY_IGNORED = {
    K.STEP: "no action of this record can be in flight in this phase",
    K.SLURM: "Slurm state only matters while draining",
    K.TICK: "nothing waits on time in this phase",
    K.RESUME: "nothing to resume in this phase",
    K.ADMIN_UNCORDON: "healer has not cordoned the node in this phase",
    K.OPT_OUT: "the record is closed: nothing to opt out of",
    K.CAPACITY: "only a node held for capacity waits for spares",
    K.REPAIR: "only a node in repair waits for a repair result",
    K.AUTO: "the phase has no automatic continuation",
    K.VERDICT: "the record is closed; it only tracks the verdict (see releases())",
}
_WHY_IGNORED_SPECIFIC = {
    (P.SWAPPING, K.ADMIN_UNCORDON): "the workload is moving to the spare: the old node's "
    "cordon no longer gates anything, and the replacement must finish",
    (P.ANNOTATING, K.ADMIN_UNCORDON): "the replacement already serves; the old node's cordon "
    "no longer gates the flow",
    (P.VALIDATING, K.ADMIN_UNCORDON): "the replacement is being validated; the old node's "
    "cordon no longer gates the flow",
    (P.UNDRAINING, K.ADMIN_UNCORDON): "the node is being returned to service anyway",
    (P.RECOVERED, K.ADMIN_UNCORDON): "healer is already undoing its own changes",
    (P.CHECKPOINTING, K.ADMIN_UNCORDON): "healer has not cordoned the node yet",
    (P.HEALTHY, K.OPT_OUT): "nothing in flight: an opted-out node never opens an incident",
    (P.DEGRADING, K.ADMIN_UNCORDON): "healer has not cordoned the node yet",
    (P.FAILED, K.ADMIN_UNCORDON): "healer has not cordoned the node yet",
    (P.SUSPECT, K.ADMIN_UNCORDON): "healer has not cordoned the node yet",
    (P.HEALTHY, K.ADMIN_UNCORDON): "no incident",
}


def _ignored() -> dict[tuple[Phase, TriggerKind], str]:
    handled = {(t.source, t.trigger) for t in TRANSITIONS}
    return {(p, k): _WHY_IGNORED_SPECIFIC.get((p, k), _WHY_IGNORED[k])
            for p in Phase for k in TriggerKind if (p, k) not in handled}


#: (phase, trigger) pairs with no row, and why that is correct.
IGNORED: Mapping[tuple[Phase, TriggerKind], str] = _ignored()

_INDEX: dict[tuple[Phase, TriggerKind], tuple[Transition, ...]] = {}
for _row in TRANSITIONS:
    _INDEX.setdefault((_row.source, _row.trigger), ())
    _INDEX[(_row.source, _row.trigger)] += (_row,)


# ---------------------------------------------------------------------------------------------
# step()


def incident_id(node: str, at: float) -> str:
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{node}-{stamp}"


def _new_record(node: str, policy: Policy, now: float, v: Verdict) -> NodeRecord:
    inc = Incident(id=incident_id(node, now), node=node, opened_at=now,
                   severity=v.severity or Severity.DEGRADING, rules=v.rules or tuple(
                       m.rule for m in v.matches), gpus=v.gpus, summary=v.summary())
    return NodeRecord(node=node, incident=inc, policy=policy.name, phase=Phase.SUSPECT.value,
                      phase_since=now, mode=policy.mode.value,
                      verdict=v.state.value, verdict_at=v.at)


MAX_AUTO_STEPS = 12


def step(record: NodeRecord | None, trigger: Trigger, now: float, view: BudgetView) -> Decision:
    """Advance ``record`` by ``trigger`` at ``now``. Pure: the same inputs give the same output."""
    if record is not None and trigger.node != record.node:
        raise ValueError(f"trigger for {trigger.node} applied to the record of {record.node}")
    phase = Phase(record.phase) if record is not None else Phase.HEALTHY
    policy = _policy_for(record, trigger.node, view, trigger.verdict)
    if record is not None:
        if trigger.at < record.last_transition:
            return Decision(record, note=f"stale trigger ({trigger.describe()}) dropped")
        if trigger.incident and trigger.incident != record.incident.id:
            return Decision(record, note=f"trigger for another incident ({trigger.incident})")
    ctx = Ctx(record, trigger, now, view, policy)
    if record is not None:
        ctx.record = _absorb(record, trigger, now)
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

    if (ctx.record is not None and Phase(ctx.record.phase) is Phase.DONE
            and not ctx.record.outcome):
        ctx.record = replace(ctx.record, outcome="done")
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


def _select(phase: Phase, kind: TriggerKind, ctx: Ctx) -> Transition | None:
    for row in _INDEX.get((phase, kind), ()):
        if row.guard(ctx):
            return row
    return None


def _policy_for(record: NodeRecord | None, node: str, view: BudgetView,
                trigger_verdict: Verdict | None) -> Policy | None:
    if record is not None and record.policy:
        p = view.policies.get(record.policy)
        if p is not None:
            return p
        if Phase(record.phase) not in (Phase.SUSPECT, Phase.DEGRADING, Phase.FAILED):
            # an in-flight remediation keeps going under the defaults if its policy vanished
            modes = {m.value: m for m in Mode}
            return Policy(name=record.policy, selector=LabelSelector(), rules=(),
                          mode=modes.get(record.mode, Mode.DRY_RUN))
        return None
    v = trigger_verdict
    if v is not None and v.policy:
        return view.policies.get(v.policy)
    n = view.nodes.get(node)
    return view.policies.for_node(n) if n is not None else None


def _absorb(record: NodeRecord, trigger: Trigger, now: float) -> NodeRecord:
    """Book-keeping every trigger does before the table: verdicts and step outcomes."""
    if trigger.kind is TriggerKind.VERDICT and trigger.verdict is not None \
            and trigger.verdict.state.value != record.verdict:
        # verdictAt: since when the verdict holds (a repeated verdict changes nothing, so it
        # costs no write)
        record = replace(record, verdict=trigger.verdict.state.value, verdict_at=trigger.verdict.at)
    r = trigger.result
    if trigger.kind is TriggerKind.STEP and r is not None:
        s = record.step(r.step)
        if s is not None and not s.done and r.status is not StepStatus.PENDING:
            outcome = {StepStatus.DONE: Outcome.OK, StepStatus.FAILED: Outcome.FAILED,
                       StepStatus.UNAVAILABLE: Outcome.FAILED}.get(r.status)
            if outcome is not None:
                record = record.with_step(replace(s, finished_at=now, outcome=outcome,
                                                  error=r.error, detail=_detail(r)))
            else:  # RETRY: keep the step open, remember the error
                record = record.with_step(replace(s, error=r.error))
        elif s is not None and not s.done and r.error and r.error != s.error:
            # PENDING with a reason (e.g. "held: drained by someone else"): kept on the open
            # step so `healer status` shows why it waits; an unchanged reason costs no write
            record = record.with_step(replace(s, error=r.error))
        slurm_node = r.get("slurmNode")
        if slurm_node and slurm_node != record.slurm_node:
            record = replace(record, slurm_node=slurm_node)
    return record


def _detail(r: StepResult) -> str:
    return ",".join(f"{k}={v}" for k, v in r.data if k != "slurmNode")


def _enter(rec: NodeRecord, source: Phase, target: Phase, now: float, label: str) -> NodeRecord:
    hist = (*rec.history, TransitionRecord(now, source.value, target.value, label))
    if len(hist) > HISTORY_LIMIT:
        hist = hist[-HISTORY_LIMIT:]
    return replace(rec, phase=target.value, phase_since=now, history=hist)


def _recheck(ctx: Ctx) -> float | None:
    rec = ctx.record
    if rec is None:
        return None
    phase = Phase(rec.phase)
    st = ctx.steps
    candidates: list[float] = []
    if phase in TERMINAL:
        return st.poll_interval if any(not s.done for s in rec.ledger) else None
    d = _deadline(ctx)
    if d is not None:
        candidates.append(max(d - ctx.now, 0.0))
    if ctx.backoff is not None:
        return min([ctx.backoff, *candidates])
    if phase is Phase.HELD_FOR_CAPACITY and not any(not s.done for s in rec.ledger):
        # a spare appearing wakes it (a CAPACITY trigger); the tick is only a backstop, so a
        # fleet with many nodes held does not ask the spare pool every poll
        candidates.append(max(st.poll_interval, HELD_RETRY))
    elif phase in (Phase.DEGRADING, Phase.FAILED):
        adm = ctx._admission
        if adm is not None and adm.recheck_after is not None:
            candidates.append(adm.recheck_after)
        elif rec.blocked is not None:
            candidates.append(30.0)
    elif phase is not Phase.SUSPECT:
        candidates.append(st.poll_interval)
    if ctx.view.is_paused(rec.node):
        candidates.append(60.0)
    return min(candidates) if candidates else None


def releases(record: NodeRecord) -> bool:
    """May the runtime take ``record`` off its node, so a new incident can open there?

    Done releases at once. Escalated and Cancelled hold the node until its verdict is healthy
    again: a human is handling it, and healer must not reopen (and re-cordon) a node an admin
    just took back. Open ledger steps (an undo in flight) always hold it.
    """
    phase = Phase(record.phase)
    if phase not in TERMINAL or any(not s.done for s in record.ledger):
        return False
    return phase is Phase.DONE or record.verdict == HealthState.HEALTHY.value


def counts_as_active(record: NodeRecord) -> bool:
    """Does ``record`` hold a ``maxConcurrent`` slot? Admitted and not yet giving back."""
    return Phase(record.phase) in ACTIVE and not record.repaired


def record_out_of_service(record: NodeRecord) -> bool:
    """Does healer hold ``record``'s node out of service (for the guardrails)?"""
    phase = Phase(record.phase)
    if phase in (Phase.DONE, Phase.CANCELLED):
        return False
    took = record.step_ok("drain") or record.step_ok("cordon")
    undone = record.step_ok("undo-drain") and record.step_ok("uncordon")
    if phase is Phase.REPAIR and record.spare:
        return False  # replaced: out of the fleet entirely
    return took and not undone


def describe_table() -> list[dict[str, Any]]:
    """The table as plain rows (for docs and ``healer workflow --json``)."""
    return [{"from": t.source.value, "trigger": t.trigger.value, "guard": t.guard.name,
             "to": t.target.value if t.target else None, "effect": t.effect.name}
            for t in TRANSITIONS]

