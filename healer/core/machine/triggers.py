"""What moves the state machine: a :class:`Trigger` of some :class:`TriggerKind`, with the
step outcome (:class:`StepResult`) or Slurm observation (:class:`SlurmObservation`) it carries."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from healer.core.health import Verdict
from healer.core.model import StepKey, StepOutcome


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
    NODE = "node"  # the Node changed as a waiting step reads it (deleted, fenced, readiness)
    AUTO = "auto"  # internal: applied after every transition until the phase settles


@dataclass(frozen=True, slots=True)
class StepResult:
    step: str  # the ledger step name (``Action.ledger_name``)
    status: StepOutcome
    error: str = ""
    data: tuple[tuple[str, str], ...] = ()

    def get(self, key: StepKey, default: str = "") -> str:
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


#: The ``healer.io/repair-result`` value a repair system writes when it found nothing to fix:
#: the node passes (as with ``passed``) and the incident counts as having found nothing.
REPAIR_NO_FAULT = "no-fault"


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
    repair_no_fault: bool = False  # REPAIR: passed, and the repair found no fault

    def describe(self) -> str:
        if self.kind is TriggerKind.VERDICT and self.verdict is not None:
            return f"verdict {self.verdict.state.value}"
        if self.kind is TriggerKind.STEP and self.result is not None:
            return f"{self.result.step} {self.result.status.value}"
        if self.kind is TriggerKind.SLURM and self.slurm is not None:
            s = self.slurm
            return f"slurm drain={s.drain} busy={s.busy}"
        if self.kind is TriggerKind.REPAIR:
            if self.repair_no_fault:
                return f"repair {REPAIR_NO_FAULT}"
            return f"repair {'passed' if self.repair_passed else 'failed'}"
        return str(self.kind.value)
