"""The guards of the transition table, each a named function of :class:`Ctx`.

A row of :mod:`healer.core.machine.table` holds one of these :class:`Guard` values; its name is
what ``docs/workflow.md`` prints in brackets. :func:`phase_deadline` lives here because the
deadline guards read it (the step's recheck and the metrics read it too).
"""

from __future__ import annotations

from healer.core.machine.context import Ctx, Guard
from healer.core.model import Guardrail, HealthState, NodeRecord, StepOutcome
from healer.core.phases import TERMINAL, Phase
from healer.core.rules import CheckpointTimeout, DrainTimeout, Mode, Policy, Steps
from healer.core.vocabulary import EXCLUDE_LABEL, StepName


def phase_deadline(rec: NodeRecord, policy: Policy | None) -> float | None:
    """The absolute deadline of ``rec``'s current phase, if it has one."""
    st = policy.steps if policy is not None else Steps()
    phase = rec.phase

    def since(step: str) -> float | None:
        s = rec.step(step)
        return s.started_at if s is not None else None

    if phase is Phase.CHECKPOINTING:
        t = since(StepName.CHECKPOINT)
        return None if t is None else t + st.checkpoint.deadline
    if phase is Phase.DRAINING:
        t = since(StepName.DRAIN)
        if t is None:
            return None
        end = t + st.drain.deadline
        rq = rec.step(StepName.REQUEUE)
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
    if phase is Phase.DEAD:  # admitted: the fence deadline; waiting for admission: none
        fence = rec.step(StepName.FENCE)
        if fence is None or policy is None:
            return None
        return fence.started_at + policy.dead.fencing.deadline
    if phase is Phase.HELD_FOR_FENCING:
        return None  # held until a provider says so (a human is alerted), never escalated
    opens = [s.started_at for s in rec.ledger if not s.done]
    if phase in TERMINAL or not opens:
        return None
    return min(opens) + st.step_deadline


def result_is(step: str, *statuses: StepOutcome) -> Guard:
    """The guard "the trigger reports ``step`` ended in one of ``statuses``"."""
    def test(ctx: Ctx) -> bool:
        r = ctx.result
        return r is not None and r.step == step and r.status in statuses
    names = "|".join(s.value for s in statuses)
    return Guard(f"{step} {names}", test)


def _verdict(ctx: Ctx) -> HealthState | None:
    v = ctx.trigger.verdict
    return v.state if v is not None else None


def _node_excluded(ctx: Ctx) -> bool:
    """Opted out (``healer.io/exclude=true``), or a warm spare (not serving: not remediated)."""
    n = ctx.view.nodes.get(ctx.trigger.node)
    if n is None:
        return False
    if n.labels.get(EXCLUDE_LABEL, "").lower() == "true":
        return True
    return any(bool(s.match_labels or s.match_expressions) and s.matches(n.labels)
               for s in ctx.view.policies.spare_selectors)


# -- the trigger --------------------------------------------------------------------------------


def always(ctx: Ctx) -> bool:
    """The last row of a (phase, trigger) pair: it always applies."""
    return True


def verdict_healthy(ctx: Ctx) -> bool:
    """The new verdict is healthy."""
    return _verdict(ctx) is HealthState.HEALTHY


def verdict_confirmed(ctx: Ctx) -> bool:
    """The new verdict is degrading or failed (confirmed, not merely suspect)."""
    v = _verdict(ctx)
    return v is not None and v.is_confirmed


def verdict_failed(ctx: Ctx) -> bool:
    """The new verdict is failed."""
    return _verdict(ctx) is HealthState.FAILED


def slurm_drained(ctx: Ctx) -> bool:
    """Slurm reports the node drained (or DOWN) and no job on it."""
    s = ctx.trigger.slurm
    return s is not None and (s.drain or s.down) and not s.busy


def repair_passed(ctx: Ctx) -> bool:
    """The repair hand-off reported success."""
    return ctx.trigger.repair_passed is True


def step_pending(ctx: Ctx) -> bool:
    """The step is still running (a poll answered "not yet")."""
    r = ctx.result
    return r is not None and r.status is StepOutcome.PENDING


def retry_attempts_left(ctx: Ctx) -> bool:
    """The step failed transiently and the policy allows another attempt."""
    r = ctx.result
    if r is None or r.status is not StepOutcome.RETRY:
        return False
    s = ctx.rec.step(r.step)
    return s is not None and not s.done and s.attempts < ctx.steps.max_attempts


def observation_failed_transiently(ctx: Ctx) -> bool:
    """Reading Slurm's view of the node failed for now (the API server or Slurm restarting):
    not a step of the remediation, so nothing to escalate; the next poll reads it again, and
    the drain deadline bounds the wait."""
    r = ctx.result
    return r is not None and r.status is StepOutcome.RETRY and r.step == StepName.OBSERVE_SLURM


def step_gave_up(ctx: Ctx) -> bool:
    """The step failed for good: retries exhausted, failed, or the target unavailable."""
    r = ctx.result
    return r is not None and r.status in (StepOutcome.RETRY, StepOutcome.FAILED,
                                          StepOutcome.UNAVAILABLE)


# -- the node and its policy --------------------------------------------------------------------


def governed(ctx: Ctx) -> bool:
    """A policy governs the node, which is neither opted out nor a warm spare."""
    return ctx.policy is not None and not _node_excluded(ctx)


def ungoverned(ctx: Ctx) -> bool:
    """The node's policy is gone, or the node opted out or is a warm spare."""
    return ctx.policy is None or _node_excluded(ctx)


def paused(ctx: Ctx) -> bool:
    """Remediation is paused for the node (``healer.io/paused``)."""
    return ctx.view.is_paused(ctx.trigger.node)


def _confirmed(ctx: Ctx, state: HealthState) -> bool:
    return _verdict(ctx) is state and governed(ctx) and not paused(ctx)


def failed_governed_unpaused(ctx: Ctx) -> bool:
    """The verdict is failed, a policy governs the node, and it is not paused."""
    return _confirmed(ctx, HealthState.FAILED)


def degrading_governed_unpaused(ctx: Ctx) -> bool:
    """The verdict is degrading, a policy governs the node, and it is not paused."""
    return _confirmed(ctx, HealthState.DEGRADING)


def suspect_governed_unpaused(ctx: Ctx) -> bool:
    """The verdict is suspect, a policy governs the node, and it is not paused."""
    return _confirmed(ctx, HealthState.SUSPECT)


def observe_only(ctx: Ctx) -> bool:
    """The policy's mode is observe: healer reports and takes no step."""
    return ctx.policy is not None and ctx.policy.mode is Mode.OBSERVE


def unconfirmed(ctx: Ctx) -> bool:
    """The record's latest verdict is neither degrading nor failed."""
    return not ctx.rec.verdict.is_confirmed


def checkpoint_first(ctx: Ctx) -> bool:
    """The policy asks jobs to checkpoint before a drain at this incident's severity."""
    return ctx.steps.checkpoint.applies_to(ctx.rec.incident.severity)


def swap_enabled(ctx: Ctx) -> bool:
    """The policy replaces a bad node with a warm spare."""
    return ctx.steps.swap.enabled


def validation_enabled(ctx: Ctx) -> bool:
    """The policy validates a replacement (and a repaired node) before it serves."""
    return ctx.steps.validation.enabled


def checkpoint_continues(ctx: Ctx) -> bool:
    """The policy drains anyway when the checkpoint is not acknowledged."""
    return ctx.steps.checkpoint.on_timeout is CheckpointTimeout.CONTINUE


def swapped(ctx: Ctx) -> bool:
    """A spare replaced the node."""
    return bool(ctx.rec.spare)


# -- the guardrails -----------------------------------------------------------------------------


def budget_exhausted(ctx: Ctx) -> bool:
    """The retry budget says escalate rather than remediate again."""
    return ctx.admission.escalate


def guardrail_blocks(ctx: Ctx) -> bool:
    """A guardrail (pause, breaker, limits, failure domains) refuses admission now."""
    return not ctx.admission.allowed


def serial_over_budget(ctx: Ctx) -> bool:
    """The incident's GPU serial failed more often than its retry budget allows."""
    b = ctx.admission.block
    return b is not None and b.guardrail is Guardrail.RETRY_BUDGET_GPU


# -- time and the ledger ------------------------------------------------------------------------


def deadline_passed(ctx: Ctx) -> bool:
    """The current phase's deadline (:func:`phase_deadline`) has passed."""
    d = phase_deadline(ctx.rec, ctx.policy)
    return d is not None and ctx.now >= d


def has_open_steps(ctx: Ctx) -> bool:
    """A ledger step is started and not finished."""
    return bool(ctx.open_steps())


def undo_finished(ctx: Ctx) -> bool:
    """No ledger step is open: the undo is complete."""
    return not ctx.open_steps()


def drain_accepted(ctx: Ctx) -> bool:
    """Slurm accepted the drain request."""
    return ctx.rec.step_ok(StepName.DRAIN)


def drain_escalates(ctx: Ctx) -> bool:
    """The drain deadline passed and the policy escalates (or a requeue already ran)."""
    return deadline_passed(ctx) and (ctx.steps.drain.on_timeout is DrainTimeout.ESCALATE
                                     or ctx.rec.step(StepName.REQUEUE) is not None)


def drain_requeues(ctx: Ctx) -> bool:
    """The drain deadline passed and the policy requeues the jobs (not yet done)."""
    return (deadline_passed(ctx) and ctx.steps.drain.on_timeout is DrainTimeout.REQUEUE
            and ctx.rec.step(StepName.REQUEUE) is None)


ALWAYS = Guard("always", always)
VERDICT_HEALTHY = Guard("verdict healthy", verdict_healthy)
VERDICT_CONFIRMED = Guard("verdict degrading|failed", verdict_confirmed)
VERDICT_FAILED = Guard("verdict failed", verdict_failed)
FAILED_CONFIRMED = Guard("verdict failed, node governed, not paused", failed_governed_unpaused)
DEGRADING_CONFIRMED = Guard("verdict degrading, node governed, not paused",
                            degrading_governed_unpaused)
SUSPECT_CONFIRMED = Guard("verdict suspect, node governed, not paused",
                          suspect_governed_unpaused)
UNGOVERNED = Guard("policy gone, node opted out or a spare", ungoverned)
OBSERVE_ONLY = Guard("observe-only", observe_only)
UNCONFIRMED = Guard("verdict not confirmed", unconfirmed)
BUDGET_EXHAUSTED = Guard("retry budget exhausted", budget_exhausted)
BLOCKED = Guard("guardrail blocks", guardrail_blocks)
CHECKPOINT_FIRST = Guard("checkpoint applies", checkpoint_first)
DEADLINE_PASSED = Guard("deadline passed", deadline_passed)
HAS_OPEN_STEPS = Guard("open steps", has_open_steps)
SLURM_DRAINED = Guard("slurm drained or down, not busy", slurm_drained)
DRAIN_ESCALATES = Guard("drain deadline passed, policy escalates", drain_escalates)
DRAIN_REQUEUES = Guard("drain deadline passed, policy requeues", drain_requeues)
DRAIN_ACCEPTED = Guard("drain accepted", drain_accepted)
REPAIR_PASSED = Guard("repair passed", repair_passed)
UNDO_FINISHED = Guard("undo finished", undo_finished)
STEP_PENDING = Guard("pending", step_pending)
RETRY_ATTEMPTS_LEFT = Guard("retry, attempts left", retry_attempts_left)
OBSERVATION_RETRY = Guard("reading Slurm failed for now", observation_failed_transiently)
STEP_GAVE_UP = Guard("retries exhausted or failed", step_gave_up)


# -- guards of one row (a step's outcome and a policy switch together) ---------------------------


def checkpoint_failed_continue(ctx: Ctx) -> bool:
    """The checkpoint request failed (or had no taker) and the policy drains anyway."""
    r = ctx.result
    return (r is not None and r.step == StepName.CHECKPOINT
            and r.status in (StepOutcome.FAILED, StepOutcome.UNAVAILABLE)
            and checkpoint_continues(ctx))


def checkpoint_deadline_continue(ctx: Ctx) -> bool:
    """The checkpoint deadline passed and the policy drains anyway."""
    return deadline_passed(ctx) and checkpoint_continues(ctx)


def drain_not_accepted_in_time(ctx: Ctx) -> bool:
    """The drain deadline passed before Slurm accepted the drain request."""
    return deadline_passed(ctx) and not drain_accepted(ctx)


_CORDON_DONE = result_is(StepName.CORDON, StepOutcome.DONE)
_ANNOTATED = result_is(StepName.ANNOTATE_TOPOLOGY, StepOutcome.DONE)
_UNDRAINED = result_is(StepName.UNDRAIN, StepOutcome.DONE)


def cordon_done_swap(ctx: Ctx) -> bool:
    """The cordon is done and the policy replaces the node with a spare."""
    return _CORDON_DONE(ctx) and swap_enabled(ctx)


def annotated_validate(ctx: Ctx) -> bool:
    """The topology is annotated and the policy validates the replacement."""
    return _ANNOTATED(ctx) and validation_enabled(ctx)


def undrained_swapped(ctx: Ctx) -> bool:
    """The replacement is undrained; the old node goes to repair."""
    return _UNDRAINED(ctx) and swapped(ctx)


def claim_not_in_flight(ctx: Ctx) -> bool:
    """No spare claim is open."""
    return not has_open_steps(ctx)


def repaired_over_budget(ctx: Ctx) -> bool:
    """The repair passed but the GPU serial is over its retry budget."""
    return repair_passed(ctx) and serial_over_budget(ctx)


def repaired_swapped(ctx: Ctx) -> bool:
    """The repair passed and a spare had replaced the node."""
    return repair_passed(ctx) and swapped(ctx)


def repaired_validate(ctx: Ctx) -> bool:
    """The repair passed and the policy validates the repaired node."""
    return repair_passed(ctx) and validation_enabled(ctx)


CHECKPOINT_FAILED_CONTINUE = Guard("checkpoint failed, policy continues",
                                   checkpoint_failed_continue)
CHECKPOINT_DEADLINE_CONTINUE = Guard("deadline passed, policy continues",
                                     checkpoint_deadline_continue)
DRAIN_NOT_ACCEPTED_IN_TIME = Guard("drain not accepted by the deadline",
                                   drain_not_accepted_in_time)
CORDON_DONE_SWAP = Guard("cordon done, swap enabled", cordon_done_swap)
ANNOTATED_VALIDATE = Guard("annotated, validation enabled", annotated_validate)
UNDRAINED_SWAPPED = Guard("undrained, old node to repair", undrained_swapped)
CLAIM_NOT_IN_FLIGHT = Guard("claim not in flight", claim_not_in_flight)
REPAIRED_OVER_BUDGET = Guard("passed, GPU serial over budget", repaired_over_budget)
REPAIRED_SWAPPED = Guard("passed, replaced by a spare", repaired_swapped)
REPAIRED_VALIDATE = Guard("passed, validation enabled", repaired_validate)
