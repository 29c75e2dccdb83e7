"""What a guard or an effect sees: :class:`Ctx` (record, trigger, clock reading, fleet view,
policy), and the two named callables a transition row holds, :class:`Guard` and :class:`Effect`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from healer.core.actions import Action, EmitEvent
from healer.core.budget import Admission, BudgetView, check_admission
from healer.core.machine.triggers import StepResult, Trigger
from healer.core.model import NodeRecord, StepOutcome, StepRecord
from healer.core.rules import Policy, Steps


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
    def result(self) -> StepResult | None:
        """The step outcome the trigger carries, if any."""
        return self.trigger.result

    @property
    def admission(self) -> Admission:
        if self._admission is None:
            assert self.policy is not None
            serials = tuple(g.serial for g in self.rec.incident.gpus if g.serial)
            self._admission = check_admission(self.rec.node, serials, self.policy, self.view,
                                              self.now, self.rec.incident.id,
                                              self.rec.incident.opened_at,
                                              dead=self.rec.death is not None)
        return self._admission

    @property
    def checked_admission(self) -> Admission | None:
        """The admission if a guard already asked for it this step (never asks itself)."""
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
                s, finished_at=self.now, outcome=StepOutcome.SKIPPED, error=why))

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
    """A named condition on :class:`Ctx`; the name is what ``docs/workflow.md`` shows."""

    name: str
    test: Callable[[Ctx], bool]

    def __call__(self, ctx: Ctx) -> bool:
        return self.test(ctx)


@dataclass(frozen=True, slots=True)
class Effect:
    """A named change to :class:`Ctx` (the record, the actions); the name is documented."""

    name: str
    apply: Callable[[Ctx], None]

    def __call__(self, ctx: Ctx) -> None:
        self.apply(ctx)
