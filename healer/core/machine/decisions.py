"""What :func:`~healer.core.machine.step` returns: a :class:`Decision`, data the runtime acts on."""

from __future__ import annotations

from dataclasses import dataclass

from healer.core.actions import Action
from healer.core.model import NodeRecord
from healer.core.phases import Phase


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
        return self.record.phase if self.record is not None else Phase.HEALTHY
