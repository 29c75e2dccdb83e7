"""The transition table, as data.

``TRANSITIONS`` is rows of (source phase, trigger kind, guard, target phase, effect). The first
row of a (phase, trigger) pair whose guard holds is applied; every handled pair ends with an
unconditional row, and every pair that is not handled is listed in ``IGNORED`` with a reason (a
test checks that the two together cover every pair, and that every phase can reach Done,
Escalated or Cancelled). After each transition the machine applies ``auto`` rows until the
phase settles.

Each phase's rows are written in its section below, in the order they are tried. Rows several
phases share are written once as named lists of :class:`Rule` (a row without its phase) and
spliced into each section that has them: ``STEP_OUTCOMES`` (every working phase), ``ADMISSION``
(Degrading and Failed), ``TERMINAL_RULES`` (Done, Escalated, Cancelled) and a few short ones.
Guards and effects are named values from :mod:`~healer.core.machine.guards` and
:mod:`~healer.core.machine.effects`; ``docs/workflow.md`` is generated from this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from healer.core.machine.context import Effect, Guard
from healer.core.machine.dead_effects import (
    ADMIT_FENCE,
    AFTER_CLEAR,
    ALIVE_AGAIN,
    FENCE_CONTRADICTED,
    FENCED,
    FENCED_GONE,
    GO_DEAD,
    HELD_FENCE,
    OPEN_DEAD,
    RECORD_LOST_JOBS,
    SPARE_THEN_OUT_OF_SERVICE,
)
from healer.core.machine.dead_guards import (
    CLAIMED_DEAD,
    CLAIMED_DEAD_DELETED,
    CLEARED_SWAPPED,
    CLEARED_VALIDATE,
    DEAD_BLOCKED,
    DEAD_BUDGET_EXHAUSTED,
    DEAD_CONFIRMED,
    DEAD_OBSERVE_ONLY,
    FENCE_ADMISSIBLE,
    FENCE_NOT_STARTED,
    FENCED_BUT_READY,
    FENCED_DELETED_NO_SWAP,
    FENCED_SILENT,
    NODE_SILENT,
    OUT_OF_SERVICE_NO_SWAP,
    OUT_OF_SERVICE_SWAP,
    REPAIRED_OUT_OF_SERVICE,
    UNDRAINED_DELETED,
    VERDICT_DEAD,
    VERDICT_DEAD_IN_FLIGHT,
)
from healer.core.machine.effects import (
    AFTER_REPAIR,
    BLOCK_GUARDRAIL,
    BLOCK_OBSERVE,
    BLOCK_UNCONFIRMED,
    CANCEL_KEEP,
    CANCEL_UNDO,
    CHECKPOINT_FAILED,
    CHECKPOINT_TIMEOUT,
    DONE,
    ESCALATE,
    HELD,
    MARK_REPAIRED,
    MOVED,
    NOTHING,
    OBSERVE,
    OPEN_INCIDENT,
    OPEN_SUSPECT,
    POLL,
    POLL_DRAIN,
    RECOVER,
    RETRY,
    SWAP_IN,
    UPGRADE,
    admit,
    escalate,
    in_order,
    issue_steps,
)
from healer.core.machine.guards import (
    ALWAYS,
    ANNOTATED_VALIDATE,
    BLOCKED,
    BUDGET_EXHAUSTED,
    CHECKPOINT_DEADLINE_CONTINUE,
    CHECKPOINT_FAILED_CONTINUE,
    CHECKPOINT_FIRST,
    CLAIM_NOT_IN_FLIGHT,
    CORDON_DONE_SWAP,
    DEADLINE_PASSED,
    DEGRADING_CONFIRMED,
    DRAIN_ACCEPTED,
    DRAIN_ESCALATES,
    DRAIN_NOT_ACCEPTED_IN_TIME,
    DRAIN_REQUEUES,
    FAILED_CONFIRMED,
    HAS_OPEN_STEPS,
    OBSERVATION_RETRY,
    OBSERVE_ONLY,
    REPAIR_PASSED,
    REPAIRED_OVER_BUDGET,
    REPAIRED_SWAPPED,
    REPAIRED_VALIDATE,
    RETRY_ATTEMPTS_LEFT,
    SLURM_DRAINED,
    STEP_GAVE_UP,
    STEP_PENDING,
    SUSPECT_CONFIRMED,
    UNCONFIRMED,
    UNDO_FINISHED,
    UNDRAINED_SWAPPED,
    UNGOVERNED,
    VERDICT_CONFIRMED,
    VERDICT_FAILED,
    VERDICT_HEALTHY,
    result_is,
)
from healer.core.machine.triggers import TriggerKind
from healer.core.model import StepOutcome
from healer.core.phases import Phase
from healer.core.vocabulary import StepName


@dataclass(frozen=True, slots=True)
class TransitionRow:
    """One row of the table: in ``source``, on ``trigger``, if ``guard``: ``effect``, then
    ``target`` (None: stay)."""

    source: Phase
    trigger: TriggerKind
    guard: Guard
    target: Phase | None  # None: stay
    effect: Effect = NOTHING

    @property
    def label(self) -> str:
        g = "" if self.guard is ALWAYS else f"[{self.guard.name}]"
        return f"{self.trigger.value}{g}"


@dataclass(frozen=True, slots=True)
class Rule:
    """A row without its source phase: written once, spliced into several phases' sections."""

    trigger: TriggerKind
    guard: Guard
    target: Phase | None
    effect: Effect = NOTHING


def rows_of(phase: Phase, *rules: Rule) -> list[TransitionRow]:
    """``rules`` as ``phase``'s rows, in the order given."""
    return [TransitionRow(phase, r.trigger, r.guard, r.target, r.effect) for r in rules]


P, K = Phase, TriggerKind
R = Rule
STAY = None
S = StepOutcome

# -- rules several phases share ------------------------------------------------------------------

#: A step's outcome that the phase's own rows did not take: wait, retry, or give up.
STEP_OUTCOMES = (
    R(K.STEP, STEP_PENDING, STAY),
    R(K.STEP, RETRY_ATTEMPTS_LEFT, STAY, RETRY),
    R(K.STEP, OBSERVATION_RETRY, STAY),
    R(K.STEP, STEP_GAVE_UP, P.ESCALATED, ESCALATE),
    R(K.STEP, ALWAYS, STAY),
)
#: A working phase carries on whatever the verdict says.
VERDICT_CHANGES_NOTHING = (R(K.VERDICT, ALWAYS, STAY),)
#: Before healer has changed anything that serves jobs, a healthy verdict ends the incident.
VERDICT_HEALTHY_RECOVERS = (
    R(K.VERDICT, VERDICT_HEALTHY, P.RECOVERED, RECOVER),
    R(K.VERDICT, ALWAYS, STAY),
)
#: A working phase escalates when its deadline passes.
DEADLINE_ESCALATES = (R(K.TICK, DEADLINE_PASSED, P.ESCALATED, ESCALATE),)
#: Time passing and a restart both re-issue the open steps (a poll, not a retry).
POLL_OPEN_STEPS = (
    R(K.TICK, ALWAYS, STAY, POLL),
    R(K.RESUME, ALWAYS, STAY, POLL),
)
#: An admin's uncordon cancels and gives back what healer took.
UNCORDON_CANCELS_AND_UNDOES = (R(K.ADMIN_UNCORDON, ALWAYS, P.CANCELLED, CANCEL_UNDO),)
#: An admin's uncordon cancels; healer's changes stay for the operator.
UNCORDON_CANCELS = (R(K.ADMIN_UNCORDON, ALWAYS, P.CANCELLED, CANCEL_KEEP),)
#: Opting out cancels; healer's changes stay for the operator.
OPT_OUT_CANCELS = (R(K.OPT_OUT, ALWAYS, P.CANCELLED, CANCEL_KEEP),)

#: A node that dies while its graceful remediation is in flight leaves it for the dead-node
#: flow (it can neither drain nor be evicted).
DIES = (R(K.VERDICT, VERDICT_DEAD_IN_FLIGHT, P.DEAD, GO_DEAD),)
#: The report of a dead node's lost jobs, in whichever dead phase it lands.
LOST_JOBS_REPORTED = (R(K.STEP, result_is(StepName.LOST_JOBS, S.DONE), STAY, RECORD_LOST_JOBS),)
#: A dead node answering again before it was fenced goes back to the graceful flow; a verdict
#: that is merely no longer "dead" (a witness let go) while the node is still not Ready is not
#: an answer.
ANSWERS_AGAIN = (
    R(K.VERDICT, VERDICT_HEALTHY, P.RECOVERED, RECOVER),
    R(K.VERDICT, VERDICT_DEAD, STAY),
    R(K.VERDICT, NODE_SILENT, STAY),
    R(K.VERDICT, ALWAYS, P.FAILED, ALIVE_AGAIN),
)
#: A provider saying the machine is off or cut off ends the wait for fencing, unless its Node
#: is Ready (its kubelet contradicts it: the next verdict takes it back to the graceful flow).
FENCED_ROWS = (
    R(K.STEP, FENCED_DELETED_NO_SWAP, P.DONE, FENCED_GONE),
    R(K.STEP, FENCED_SILENT, P.OUT_OF_SERVICE, FENCED),
    R(K.STEP, FENCED_BUT_READY, STAY, FENCE_CONTRADICTED),
)
#: A change of the Node wakes the step that reads it (a fence provider, the node's readiness).
NODE_WAKES = (R(K.NODE, ALWAYS, STAY, POLL),)

#: Degrading and Failed wait for admission: every guardrail in turn, then the first step.
ADMISSION = (
    R(K.VERDICT, VERDICT_HEALTHY, P.RECOVERED, RECOVER),
    R(K.VERDICT, ALWAYS, STAY),
    R(K.TICK, ALWAYS, STAY),
    R(K.RESUME, ALWAYS, STAY),
    R(K.OPT_OUT, ALWAYS, P.CANCELLED, CANCEL_KEEP),
    R(K.AUTO, UNGOVERNED, P.CANCELLED, CANCEL_KEEP),
    R(K.AUTO, OBSERVE_ONLY, STAY, BLOCK_OBSERVE),
    R(K.AUTO, UNCONFIRMED, STAY, BLOCK_UNCONFIRMED),
    R(K.AUTO, BUDGET_EXHAUSTED, P.ESCALATED, ESCALATE),
    R(K.AUTO, BLOCKED, STAY, BLOCK_GUARDRAIL),
    R(K.AUTO, CHECKPOINT_FIRST, P.CHECKPOINTING, admit(StepName.CHECKPOINT)),
    R(K.AUTO, ALWAYS, P.DRAINING, admit(StepName.DRAIN)),
)

#: Done, Escalated and Cancelled only finish their open (undo) steps.
TERMINAL_RULES = (
    R(K.STEP, ALWAYS, STAY),
    R(K.RESUME, ALWAYS, STAY, POLL),
    R(K.TICK, HAS_OPEN_STEPS, STAY, POLL),
    R(K.TICK, ALWAYS, STAY),
)

# -- the table -----------------------------------------------------------------------------------

TRANSITIONS: tuple[TransitionRow, ...] = (
    # -- Healthy: no record ------------------------------------------------------------------
    *rows_of(P.HEALTHY,
             R(K.VERDICT, DEAD_CONFIRMED, P.DEAD, OPEN_DEAD),
             R(K.VERDICT, FAILED_CONFIRMED, P.FAILED, OPEN_INCIDENT),
             R(K.VERDICT, DEGRADING_CONFIRMED, P.DEGRADING, OPEN_INCIDENT),
             R(K.VERDICT, SUSPECT_CONFIRMED, P.SUSPECT, OPEN_SUSPECT),
             R(K.VERDICT, ALWAYS, STAY)),
    # -- Suspect: waiting out for:/count -----------------------------------------------------
    *rows_of(P.SUSPECT,
             R(K.VERDICT, VERDICT_DEAD, P.DEAD, OPEN_DEAD),
             R(K.VERDICT, VERDICT_FAILED, P.FAILED, OPEN_INCIDENT),
             R(K.VERDICT, VERDICT_CONFIRMED, P.DEGRADING, OPEN_INCIDENT),
             R(K.VERDICT, VERDICT_HEALTHY, P.HEALTHY),
             R(K.VERDICT, ALWAYS, STAY),
             R(K.TICK, ALWAYS, STAY),
             R(K.RESUME, ALWAYS, STAY),
             R(K.OPT_OUT, ALWAYS, P.HEALTHY),
             R(K.AUTO, UNGOVERNED, P.HEALTHY)),
    # -- Degrading / Failed: waiting for admission -------------------------------------------
    *rows_of(P.DEGRADING,
             *DIES,
             R(K.VERDICT, VERDICT_FAILED, P.FAILED, UPGRADE),
             *ADMISSION),
    *rows_of(P.FAILED, *DIES, *ADMISSION),
    # -- Checkpointing -----------------------------------------------------------------------
    *rows_of(P.CHECKPOINTING,
             *DIES,
             R(K.STEP, result_is(StepName.CHECKPOINT, S.DONE), P.DRAINING,
               issue_steps(StepName.DRAIN)),
             R(K.STEP, CHECKPOINT_FAILED_CONTINUE, P.DRAINING, CHECKPOINT_FAILED),
             *VERDICT_HEALTHY_RECOVERS,
             *STEP_OUTCOMES,
             R(K.TICK, CHECKPOINT_DEADLINE_CONTINUE, P.DRAINING, CHECKPOINT_TIMEOUT),
             R(K.TICK, DEADLINE_PASSED, P.ESCALATED,
               escalate("checkpoint not acknowledged before the deadline")),
             *POLL_OPEN_STEPS,
             *OPT_OUT_CANCELS),
    # -- Draining ----------------------------------------------------------------------------
    *rows_of(P.DRAINING,
             *DIES,
             R(K.STEP, result_is(StepName.DRAIN, S.DONE), STAY, OBSERVE),
             R(K.STEP, result_is(StepName.REQUEUE, S.DONE), STAY, OBSERVE),
             R(K.SLURM, SLURM_DRAINED, P.CORDONED, issue_steps(StepName.CORDON)),
             R(K.SLURM, DRAIN_REQUEUES, STAY, issue_steps(StepName.REQUEUE)),
             R(K.SLURM, DRAIN_ESCALATES, P.ESCALATED,
               escalate("jobs still running on the node at the drain deadline")),
             R(K.SLURM, ALWAYS, STAY),
             *VERDICT_HEALTHY_RECOVERS,
             *STEP_OUTCOMES,
             R(K.TICK, DRAIN_NOT_ACCEPTED_IN_TIME, P.ESCALATED,
               escalate("the drain request was not accepted before the deadline")),
             R(K.TICK, DRAIN_ACCEPTED, STAY, POLL_DRAIN),
             *POLL_OPEN_STEPS,
             *UNCORDON_CANCELS_AND_UNDOES,
             *OPT_OUT_CANCELS),
    # -- Cordoned ----------------------------------------------------------------------------
    *rows_of(P.CORDONED,
             *DIES,
             R(K.STEP, CORDON_DONE_SWAP, STAY, issue_steps(StepName.CLAIM_SPARE)),
             R(K.STEP, result_is(StepName.CORDON, S.DONE), P.REPAIR,
               issue_steps(StepName.MARK_REPAIR)),
             R(K.STEP, result_is(StepName.CLAIM_SPARE, S.DONE), P.SWAPPING, SWAP_IN),
             R(K.STEP, result_is(StepName.CLAIM_SPARE, S.UNAVAILABLE), P.HELD_FOR_CAPACITY, HELD),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *UNCORDON_CANCELS_AND_UNDOES,
             *OPT_OUT_CANCELS),
    # -- HeldForCapacity ---------------------------------------------------------------------
    *rows_of(P.HELD_FOR_CAPACITY,
             *DIES,
             R(K.STEP, CLAIMED_DEAD_DELETED, P.SWAPPING, SWAP_IN),
             R(K.STEP, CLAIMED_DEAD, P.OUT_OF_SERVICE, SPARE_THEN_OUT_OF_SERVICE),
             R(K.STEP, result_is(StepName.CLAIM_SPARE, S.DONE), P.SWAPPING, SWAP_IN),
             R(K.STEP, result_is(StepName.CLAIM_SPARE, S.UNAVAILABLE), STAY),
             R(K.CAPACITY, ALWAYS, STAY, issue_steps(StepName.CLAIM_SPARE, reopen=True)),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             R(K.TICK, DEADLINE_PASSED, P.ESCALATED,
               escalate("no spare became available before the hold timeout")),
             R(K.TICK, CLAIM_NOT_IN_FLIGHT, STAY, issue_steps(StepName.CLAIM_SPARE, reopen=True)),
             *POLL_OPEN_STEPS,
             *UNCORDON_CANCELS_AND_UNDOES,
             *OPT_OUT_CANCELS),
    # -- Swapping ----------------------------------------------------------------------------
    *rows_of(P.SWAPPING,
             R(K.STEP, result_is(StepName.MOVE_WORKLOAD, S.DONE), STAY, MOVED),
             R(K.STEP, result_is(StepName.AWAIT_REPLACEMENT, S.DONE), P.ANNOTATING,
               issue_steps(StepName.ANNOTATE_TOPOLOGY)),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *OPT_OUT_CANCELS),
    # -- Annotating --------------------------------------------------------------------------
    *rows_of(P.ANNOTATING,
             R(K.STEP, ANNOTATED_VALIDATE, P.VALIDATING,
               issue_steps(StepName.VALIDATE_REPLACEMENT)),
             R(K.STEP, result_is(StepName.ANNOTATE_TOPOLOGY, S.DONE), P.UNDRAINING,
               issue_steps(StepName.UNDRAIN)),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *OPT_OUT_CANCELS),
    # -- Validating --------------------------------------------------------------------------
    *rows_of(P.VALIDATING,
             R(K.STEP, result_is(StepName.VALIDATE_REPLACEMENT, S.DONE), P.UNDRAINING,
               issue_steps(StepName.UNDRAIN)),
             R(K.STEP, result_is(StepName.VALIDATE_REPLACEMENT, S.FAILED), P.ESCALATED,
               escalate("validation failed")),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *OPT_OUT_CANCELS),
    # -- Undraining --------------------------------------------------------------------------
    *rows_of(P.UNDRAINING,
             R(K.STEP, UNDRAINED_DELETED, P.DONE, DONE),
             R(K.STEP, UNDRAINED_SWAPPED, P.REPAIR, issue_steps(StepName.MARK_REPAIR)),
             R(K.STEP, result_is(StepName.UNDRAIN, S.DONE), STAY, issue_steps(StepName.UNCORDON)),
             R(K.STEP, result_is(StepName.UNCORDON, S.DONE), P.DONE, DONE),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *OPT_OUT_CANCELS),
    # -- Repair ------------------------------------------------------------------------------
    *rows_of(P.REPAIR,
             R(K.REPAIR, REPAIRED_OVER_BUDGET, P.ESCALATED,
               escalate("repaired GPU failed too often: not returned to service")),
             R(K.REPAIR, REPAIRED_OUT_OF_SERVICE, STAY,
               in_order(MARK_REPAIRED, issue_steps(StepName.CLEAR_OUT_OF_SERVICE))),
             R(K.REPAIR, REPAIRED_SWAPPED, STAY, AFTER_REPAIR),
             R(K.REPAIR, REPAIRED_VALIDATE, P.VALIDATING,
               in_order(MARK_REPAIRED, issue_steps(StepName.VALIDATE_REPLACEMENT))),
             R(K.REPAIR, REPAIR_PASSED, P.UNDRAINING, in_order(MARK_REPAIRED,
                                                              issue_steps(StepName.UNDRAIN))),
             R(K.REPAIR, ALWAYS, P.ESCALATED, escalate("repair failed")),
             R(K.STEP, result_is(StepName.VALIDATE_REPAIRED, S.DONE), STAY,
               issue_steps(StepName.RETURN_TO_POOL)),
             R(K.STEP, result_is(StepName.VALIDATE_REPAIRED, S.FAILED), P.ESCALATED,
               escalate("validation of the repaired node failed")),
             R(K.STEP, result_is(StepName.RETURN_TO_POOL, S.DONE), P.DONE, DONE),
             R(K.STEP, CLEARED_SWAPPED, STAY, AFTER_CLEAR),
             R(K.STEP, CLEARED_VALIDATE, P.VALIDATING,
               issue_steps(StepName.VALIDATE_REPLACEMENT)),
             R(K.STEP, result_is(StepName.CLEAR_OUT_OF_SERVICE, S.DONE), P.UNDRAINING,
               issue_steps(StepName.UNDRAIN)),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             R(K.TICK, DEADLINE_PASSED, P.ESCALATED,
               escalate("repair did not finish before its deadline")),
             *POLL_OPEN_STEPS,
             R(K.NODE, HAS_OPEN_STEPS, STAY, POLL),
             R(K.NODE, ALWAYS, STAY),
             *UNCORDON_CANCELS,
             *OPT_OUT_CANCELS),
    # -- Dead: waiting for admission, then for a fencing provider ----------------------------
    *rows_of(P.DEAD,
             *ANSWERS_AGAIN,
             *FENCED_ROWS,
             *LOST_JOBS_REPORTED,
             *STEP_OUTCOMES,
             R(K.TICK, DEADLINE_PASSED, P.HELD_FOR_FENCING, HELD_FENCE),
             R(K.TICK, FENCE_NOT_STARTED, STAY),
             *POLL_OPEN_STEPS,
             *NODE_WAKES,
             *OPT_OUT_CANCELS,
             R(K.AUTO, UNGOVERNED, P.CANCELLED, CANCEL_KEEP),
             R(K.AUTO, DEAD_OBSERVE_ONLY, STAY, BLOCK_OBSERVE),
             R(K.AUTO, DEAD_BUDGET_EXHAUSTED, P.ESCALATED, ESCALATE),
             R(K.AUTO, DEAD_BLOCKED, STAY, BLOCK_GUARDRAIL),
             R(K.AUTO, FENCE_ADMISSIBLE, STAY, ADMIT_FENCE)),
    # -- HeldForFencing: no provider said so in time; nothing is force-deleted -------------
    *rows_of(P.HELD_FOR_FENCING,
             *ANSWERS_AGAIN,
             *FENCED_ROWS,
             *LOST_JOBS_REPORTED,
             *STEP_OUTCOMES,
             *POLL_OPEN_STEPS,
             *NODE_WAKES,
             *OPT_OUT_CANCELS),
    # -- OutOfService: fenced; claim, taint out of service, then swap ----------------------
    *rows_of(P.OUT_OF_SERVICE,
             R(K.STEP, CLAIMED_DEAD_DELETED, P.SWAPPING, SWAP_IN),
             R(K.STEP, result_is(StepName.CLAIM_SPARE, S.DONE), STAY,
               SPARE_THEN_OUT_OF_SERVICE),
             R(K.STEP, result_is(StepName.CLAIM_SPARE, S.UNAVAILABLE), P.HELD_FOR_CAPACITY, HELD),
             R(K.STEP, OUT_OF_SERVICE_SWAP, P.SWAPPING, issue_steps(StepName.MOVE_WORKLOAD)),
             R(K.STEP, OUT_OF_SERVICE_NO_SWAP, P.REPAIR, issue_steps(StepName.MARK_REPAIR)),
             *LOST_JOBS_REPORTED,
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *NODE_WAKES,
             *UNCORDON_CANCELS_AND_UNDOES,
             *OPT_OUT_CANCELS),
    # -- Recovered: undo own changes, then Done ----------------------------------------------
    *rows_of(P.RECOVERED,
             R(K.AUTO, UNDO_FINISHED, P.DONE, NOTHING),
             *VERDICT_CHANGES_NOTHING,
             *STEP_OUTCOMES,
             *DEADLINE_ESCALATES,
             *POLL_OPEN_STEPS,
             *OPT_OUT_CANCELS),
    # -- terminal phases: only finish open undo steps ----------------------------------------
    *rows_of(P.DONE, *TERMINAL_RULES),
    *rows_of(P.ESCALATED, *TERMINAL_RULES),
    *rows_of(P.CANCELLED, *TERMINAL_RULES),
)

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
    K.NODE: "no step of this phase waits on the Node object itself",
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
    (P.DEAD, K.ADMIN_UNCORDON): "healer cordons a dead node only once it is fenced",
    (P.HELD_FOR_FENCING, K.ADMIN_UNCORDON): "healer cordons a dead node only once it is "
    "fenced",
}


def _ignored() -> dict[tuple[Phase, TriggerKind], str]:
    handled = {(t.source, t.trigger) for t in TRANSITIONS}
    return {(p, k): _WHY_IGNORED_SPECIFIC.get((p, k), _WHY_IGNORED[k])
            for p in Phase for k in TriggerKind if (p, k) not in handled}


#: (phase, trigger) pairs with no row, and why that is correct.
IGNORED: Mapping[tuple[Phase, TriggerKind], str] = _ignored()


def _index() -> dict[tuple[Phase, TriggerKind], tuple[TransitionRow, ...]]:
    index: dict[tuple[Phase, TriggerKind], tuple[TransitionRow, ...]] = {}
    for row in TRANSITIONS:
        index[(row.source, row.trigger)] = (*index.get((row.source, row.trigger), ()), row)
    return index


#: The rows of each (phase, trigger) pair, in the order they are tried.
ROWS_BY_PAIR: Mapping[tuple[Phase, TriggerKind], tuple[TransitionRow, ...]] = _index()


def describe_table() -> list[dict[str, Any]]:
    """The table as plain rows (for docs and ``healer workflow --json``)."""
    return [{"from": t.source.value, "trigger": t.trigger.value, "guard": t.guard.name,
             "to": t.target.value if t.target else None, "effect": t.effect.name}
            for t in TRANSITIONS]
