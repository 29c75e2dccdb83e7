"""The guards of the transition table's dead-node rows (see
:mod:`healer.core.machine.dead_effects`), each a named function of :class:`Ctx`."""

from __future__ import annotations

from healer.core.machine.context import Ctx, Guard
from healer.core.machine.guards import (
    budget_exhausted,
    governed,
    guardrail_blocks,
    observe_only,
    paused,
    repair_passed,
    result_is,
    serial_over_budget,
    swap_enabled,
    swapped,
    validation_enabled,
)
from healer.core.model import FenceProvider, HealthState, StepKey, StepOutcome
from healer.core.vocabulary import StepName


def _verdict_is(ctx: Ctx, state: HealthState) -> bool:
    v = ctx.trigger.verdict
    return v is not None and v.state is state


def _dead_handled(ctx: Ctx) -> bool:
    return ctx.policy is not None and ctx.policy.dead.enabled


def verdict_dead(ctx: Ctx) -> bool:
    """The verdict is dead and the node's policy handles dead nodes."""
    return _verdict_is(ctx, HealthState.DEAD) and _dead_handled(ctx)


def verdict_dead_alive_record(ctx: Ctx) -> bool:
    """The verdict is dead (the policy handles dead nodes) and the record is not in the
    dead-node flow yet: the node died while its graceful remediation was in flight."""
    return verdict_dead(ctx) and ctx.rec.death is None


def node_silent(ctx: Ctx) -> bool:
    """The node's Ready condition is still not True (or the Node is gone): whatever the verdict
    says (a witness may have let go: Slurm hears its slurmd again, or the Ready condition's
    transition time restarted its deadAfter clock), its kubelet has not answered."""
    view = ctx.view.nodes.get(ctx.rec.node)
    return view is None or not view.ready


def dead_observe_only(ctx: Ctx) -> bool:
    """Fencing not asked for, and the policy's mode is observe: report, fence nothing."""
    return fence_not_started(ctx) and observe_only(ctx)


def dead_governed_unpaused(ctx: Ctx) -> bool:
    """The verdict is dead, a policy that handles dead nodes governs the node, not paused."""
    return (_verdict_is(ctx, HealthState.DEAD) and governed(ctx) and not paused(ctx)
            and _dead_handled(ctx))


def fence_not_started(ctx: Ctx) -> bool:
    """The dead node's fencing was not asked for yet (admission pending)."""
    return ctx.rec.step(StepName.FENCE) is None


def fence_admissible(ctx: Ctx) -> bool:
    """Fencing not asked for yet, and the node still silent: a dead record whose Node is Ready
    again (its verdict not caught up yet) is never admitted, since the guardrails would read
    it as answering (a mass death whose nodes all came back trips nothing)."""
    return fence_not_started(ctx) and node_silent(ctx)


def dead_blocked(ctx: Ctx) -> bool:
    """Fencing not started, and a guardrail refuses it now (pause, breaker, mass death)."""
    return fence_not_started(ctx) and guardrail_blocks(ctx)


def dead_budget_exhausted(ctx: Ctx) -> bool:
    """Fencing not started, and the retry budget says escalate."""
    return fence_not_started(ctx) and budget_exhausted(ctx)


_FENCED = result_is(StepName.FENCE, StepOutcome.DONE)


def _fenced_deleted(ctx: Ctx) -> bool:
    r = ctx.result
    return _FENCED(ctx) and r is not None and r.get(StepKey.PROVIDER) == \
        FenceProvider.NODE_DELETED.value


def fenced_silent(ctx: Ctx) -> bool:
    """A provider says the machine is off, and its Node is not Ready (or gone)."""
    return _FENCED(ctx) and node_silent(ctx)


def fenced_but_ready(ctx: Ctx) -> bool:
    """A provider says the machine is off, but its Node is Ready: its kubelet contradicts the
    fence (a stale annotation, a provider mistaken): nothing is taken out of service."""
    return _FENCED(ctx) and not node_silent(ctx)


def fenced_deleted_no_swap(ctx: Ctx) -> bool:
    """Fenced by the Node's deletion, and the policy does not swap: nothing is left to do."""
    return _fenced_deleted(ctx) and not swap_enabled(ctx)


def node_deleted(ctx: Ctx) -> bool:
    """The dead node's Node object was deleted (fenced by ``nodeDeleted``)."""
    return ctx.rec.node_deleted


def claimed_dead_deleted(ctx: Ctx) -> bool:
    """A spare is claimed for a dead node whose Node was deleted: its pods are gone already."""
    return result_is(StepName.CLAIM_SPARE, StepOutcome.DONE)(ctx) and ctx.rec.node_deleted


def claimed_dead(ctx: Ctx) -> bool:
    """A spare is claimed for a fenced dead node."""
    return result_is(StepName.CLAIM_SPARE, StepOutcome.DONE)(ctx) and ctx.rec.death is not None


_UNDRAINED = result_is(StepName.UNDRAIN, StepOutcome.DONE)
_OOS_DONE = result_is(StepName.OUT_OF_SERVICE, StepOutcome.DONE)


def out_of_service_swap(ctx: Ctx) -> bool:
    """The out-of-service taint is on and a spare is claimed: move the workload."""
    return _OOS_DONE(ctx) and swap_enabled(ctx) and bool(ctx.rec.spare)


def out_of_service_no_swap(ctx: Ctx) -> bool:
    """The out-of-service taint is on and the policy repairs in place."""
    return _OOS_DONE(ctx) and not swap_enabled(ctx)


def undrained_deleted(ctx: Ctx) -> bool:
    """The replacement is undrained; the dead node's Node is gone: nothing to repair."""
    return _UNDRAINED(ctx) and swapped(ctx) and ctx.rec.node_deleted


def repaired_out_of_service(ctx: Ctx) -> bool:
    """The repair passed and healer's out-of-service taint must come off first."""
    return repair_passed(ctx) and not serial_over_budget(ctx) and \
        ctx.rec.step_ok(StepName.OUT_OF_SERVICE) and \
        not ctx.rec.step_ok(StepName.CLEAR_OUT_OF_SERVICE)


_CLEARED = result_is(StepName.CLEAR_OUT_OF_SERVICE, StepOutcome.DONE)


def cleared_swapped(ctx: Ctx) -> bool:
    """The out-of-service taint is off; a spare had replaced the node."""
    return _CLEARED(ctx) and swapped(ctx)


def cleared_validate(ctx: Ctx) -> bool:
    """The out-of-service taint is off; the policy validates the repaired node."""
    return _CLEARED(ctx) and validation_enabled(ctx)


VERDICT_DEAD = Guard("verdict dead", verdict_dead)
NODE_SILENT = Guard("node still not Ready", node_silent)
FENCE_ADMISSIBLE = Guard("fencing not asked for yet, node still not Ready", fence_admissible)
FENCED_SILENT = Guard("fence done, node not Ready", fenced_silent)
FENCED_BUT_READY = Guard("fence done, but the node is Ready", fenced_but_ready)
VERDICT_DEAD_IN_FLIGHT = Guard("verdict dead, not in the dead-node flow yet",
                               verdict_dead_alive_record)
DEAD_OBSERVE_ONLY = Guard("fencing not asked for, observe-only", dead_observe_only)
DEAD_CONFIRMED = Guard("verdict dead, node governed, not paused", dead_governed_unpaused)
FENCE_NOT_STARTED = Guard("fencing not asked for yet", fence_not_started)
DEAD_BLOCKED = Guard("fencing not asked for, guardrail blocks", dead_blocked)
DEAD_BUDGET_EXHAUSTED = Guard("fencing not asked for, retry budget exhausted",
                              dead_budget_exhausted)
FENCED_DELETED_NO_SWAP = Guard("fenced by the Node's deletion, swap disabled",
                               fenced_deleted_no_swap)
NODE_DELETED = Guard("Node deleted", node_deleted)
CLAIMED_DEAD_DELETED = Guard("claim-spare done, dead Node deleted", claimed_dead_deleted)
CLAIMED_DEAD = Guard("claim-spare done, node dead", claimed_dead)
OUT_OF_SERVICE_SWAP = Guard("out-of-service done, swap enabled", out_of_service_swap)
OUT_OF_SERVICE_NO_SWAP = Guard("out-of-service done, swap disabled", out_of_service_no_swap)
UNDRAINED_DELETED = Guard("undrained, dead Node deleted", undrained_deleted)
REPAIRED_OUT_OF_SERVICE = Guard("passed, out-of-service taint to clear",
                                repaired_out_of_service)
CLEARED_SWAPPED = Guard("clear-out-of-service done, replaced by a spare", cleared_swapped)
CLEARED_VALIDATE = Guard("clear-out-of-service done, validation enabled", cleared_validate)
