"""The remediation state machine: a transition table and the pure :func:`step` that runs it.

:func:`step` is the only entry point: ``(record, trigger, now, view) -> Decision``. It never
performs I/O; the executor runs the Decision's actions and reports their outcomes as new
triggers. Intent is recorded in the ledger (a started, unfinished step) by the same call that
emits an action, so a runtime that persists the returned record *before* running the actions
can always resume: ``RESUME`` re-issues every open step (actions are idempotent).

The package is split by role, read in this order:

- :mod:`.triggers`: what moves the machine (:class:`Trigger`, :class:`TriggerKind`,
  :class:`StepResult`, :class:`SlurmObservation`);
- :mod:`.decisions`: what it answers (:class:`Decision`);
- :mod:`.context`: what a guard or an effect sees (``Ctx``) and the ``Guard``/``Effect`` types;
- :mod:`.guards`: the named guards (and :func:`phase_deadline`);
- :mod:`.effects`: the named effects (and the action each ledger step runs);
- :mod:`.table`: the transition table as data (``TRANSITIONS``, ``IGNORED``);
- :mod:`.stepping`: :func:`step` and the queries on a record.

The names below are the machine's public surface; the rest of healer imports them from here.
"""

from healer.core.machine.decisions import Decision
from healer.core.machine.effects import held_reason, incident_id
from healer.core.machine.guards import phase_deadline
from healer.core.machine.stepping import (
    counts_as_active,
    record_out_of_service,
    recorded_events,
    releases,
    step,
)
from healer.core.machine.table import IGNORED, TRANSITIONS, TransitionRow, describe_table
from healer.core.machine.triggers import SlurmObservation, StepResult, Trigger, TriggerKind

__all__ = [
    "IGNORED",
    "TRANSITIONS",
    "Decision",
    "SlurmObservation",
    "StepResult",
    "TransitionRow",
    "Trigger",
    "TriggerKind",
    "counts_as_active",
    "describe_table",
    "held_reason",
    "incident_id",
    "phase_deadline",
    "record_out_of_service",
    "recorded_events",
    "releases",
    "step",
]
